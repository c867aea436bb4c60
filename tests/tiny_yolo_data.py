"""A detection dataset small enough for a test: a few synthetic images with boxes, in
Ultralytics' YOLO format (images/<split>/*.png, labels/<split>/*.txt, a data yaml), made on
disk so that no download is needed."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def make_tiny_dataset(root: Path, n_train: int = 8, n_val: int = 4, size: int = 160) -> Path:
    """Writes the dataset under ``root`` and returns its data yaml.

    Each image is noise with one to three filled rectangles; each rectangle is a box of
    class 0. Seeded, so every call writes the same files.
    """
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("val", n_val)):
        images, labels = root / "images" / split, root / "labels" / split
        images.mkdir(parents=True, exist_ok=True)
        labels.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img = rng.integers(0, 64, (size, size, 3), dtype=np.uint8)
            rows = []
            for _ in range(rng.integers(1, 4)):
                w, h = rng.integers(size // 6, size // 2, 2)
                x0, y0 = rng.integers(0, size - w), rng.integers(0, size - h)
                img[y0:y0 + h, x0:x0 + w] = rng.integers(128, 256, 3, dtype=np.uint8)
                rows.append(f"0 {(x0 + w / 2) / size:.6f} {(y0 + h / 2) / size:.6f} "
                            f"{w / size:.6f} {h / size:.6f}")
            Image.fromarray(img).save(images / f"{i}.png")
            (labels / f"{i}.txt").write_text("\n".join(rows) + "\n")
    data = root / "data.yaml"
    # An absolute path: Ultralytics resolves a relative one against its datasets_dir setting.
    data.write_text(f"path: {root.resolve()}\ntrain: images/train\nval: images/val\n"
                    "names:\n  0: box\n")
    return data
