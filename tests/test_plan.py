"""Which kernels and copies a CUDA call runs, pinned for a table of calls and devices.

plan_fwd / plan_bwd (csrc/cuda/plan.h) are the one place that decides; they compile in every
build, so these run without a GPU. A change that moves a call to another kernel or copy fails
here and has to change the table on purpose.
"""
import pytest
import torch

from psa_fa2_ext import _plan

H100, A100, RTX4090 = _plan.DEVICES["h100"], _plan.DEVICES["a100"], _plan.DEVICES["rtx4090"]

# (device, B, H, N, dk, dv, dtype, layout, options) -> expected forward, backward description.
CASES = [
    # The YOLO PSA shapes on Hopper: wgmma on the views as they come...
    (H100, 16, 4, 400, 32, 64, "bf16", "psa", {},
     "wgmma forward bf16 32x64 channel_first q/out 16B, K/V rows 16B; CTA 64 query rows x "
     "64-key steps",
     "wgmma backward bf16 32x64 channel_first rows 16B, Q/dO rows 16B; CTA 128 keys x 64-row "
     "steps"),
    (H100, 16, 4, 1600, 32, 64, "fp16", "psa", {},
     "wgmma forward fp16 32x64 channel_first q/out 16B, K/V rows 16B; CTA 64 query rows x "
     "64-key steps",
     "wgmma backward fp16 32x64 channel_first rows 16B, Q/dO rows 16B; CTA 128 keys x 64-row "
     "steps, last wave split 3 ways"),
    # ... odd N: K / V copied to aligned rows (forward), Q / dO to stream images (backward) ...
    (H100, 16, 4, 1601, 32, 64, "bf16", "psa", {},
     "wgmma forward bf16 32x64 channel_first q/out 2B, K/V rows 16B; CTA 64 query rows x "
     "64-key steps; copies K, V to 128-byte aligned rows",
     "wgmma backward bf16 32x64 channel_first rows 2B, Q/dO stream images; CTA 128 keys x "
     "64-row steps, last wave split 3 ways; copies Q, dO to stream images"),
    # ... and long rows on tile images, three warpgroups where their waves fall better.
    (H100, 1, 2, 62500, 32, 64, "bf16", "psa", {},
     "wgmma forward bf16 32x64 channel_first q/out 8B, K/V tile images; CTA 3 warpgroups, 192 "
     "query rows x 128-key steps; copies K, V to tile images",
     "wgmma backward bf16 32x64 channel_first rows 8B, Q/dO stream images; CTA 128 keys x "
     "64-row steps, last wave split 2 ways; copies Q, dO to stream images"),
    (H100, 4, 4, 12800, 32, 64, "bf16", "psa", {},
     "wgmma forward bf16 32x64 channel_first q/out 16B, K/V tile images; CTA 3 warpgroups, 192 "
     "query rows x 128-key steps; copies K, V to tile images",
     "wgmma backward bf16 32x64 channel_first rows 16B, Q/dO stream images; CTA 128 keys x "
     "64-row steps, last wave split 8 ways; copies Q, dO to stream images"),
    (H100, 1, 2, 12800, 32, 64, "bf16", "psa", {},
     "wgmma forward bf16 32x64 channel_first q/out 16B, K/V tile images; CTA 2 warpgroups, 128 "
     "query rows x 64-key steps; copies K, V to tile images",
     "wgmma backward bf16 32x64 channel_first rows 16B, Q/dO stream images; CTA 128 keys x "
     "64-row steps; copies Q, dO to stream images"),
    (H100, 16, 4, 400, 32, 64, "bf16", "token_major", {},
     "wgmma forward bf16 32x64 token_major q/out 16B, K/V rows 16B; CTA 64 query rows x 64-key "
     "steps",
     "wgmma backward bf16 32x64 token_major rows 16B, Q/dO rows 16B; CTA 128 keys x 64-row "
     "steps"),
    # Deterministic: the mma.sync kernel's combined schedule, no atomics.
    (H100, 16, 4, 400, 32, 64, "bf16", "psa", {"deterministic": True},
     "wgmma forward bf16 32x64 channel_first q/out 16B, K/V rows 16B; CTA 64 query rows x "
     "64-key steps",
     "mma.sync backward bf16 32x64 channel_first; combined schedule (deterministic), CTA 128 "
     "query rows"),
    # (32, 32), YOLO12's area attention: the wgmma kernels at dv = 32.
    (H100, 64, 2, 400, 32, 32, "bf16", "psa", {},
     "wgmma forward bf16 32x32 channel_first q/out 16B, K/V rows 16B; CTA 64 query rows x "
     "64-key steps",
     "wgmma backward bf16 32x32 channel_first rows 16B, Q/dO rows 16B; CTA 128 keys x 64-row "
     "steps"),
    (H100, 16, 8, 400, 32, 32, "fp16", "token_major", {},
     "wgmma forward fp16 32x32 token_major q/out 16B, K/V rows 16B; CTA 64 query rows x 64-key "
     "steps",
     "wgmma backward fp16 32x32 token_major rows 16B, Q/dO rows 16B; CTA 128 keys x 64-row "
     "steps"),
    # Head dims without a wgmma kernel run mma.sync on Hopper too.
    (H100, 8, 4, 400, 64, 64, "bf16", "psa", {},
     "mma.sync forward bf16 64x64 channel_first rows 16B; CTA 64 query rows x 64-key tiles",
     "mma.sync backward bf16 64x64 channel_first; atomic-dQ schedule, CTA 128 keys"),
    (H100, 2, 8, 1024, 128, 128, "fp16", "token_major", {},
     "mma.sync forward fp16 128x128 token_major rows 16B; CTA 64 query rows x 64-key tiles",
     "mma.sync backward fp16 128x128 token_major; atomic-dQ schedule, CTA 128 keys"),
    # Ampere and Ada: mma.sync everywhere.
    (A100, 16, 4, 400, 32, 64, "bf16", "psa", {},
     "mma.sync forward bf16 32x64 channel_first rows 16B; CTA 64 query rows x 64-key tiles",
     "mma.sync backward bf16 32x64 channel_first; atomic-dQ schedule, CTA 128 keys"),
    (RTX4090, 16, 4, 401, 32, 64, "fp16", "psa", {},
     "mma.sync forward fp16 32x64 channel_first rows 2B; CTA 64 query rows x 64-key tiles",
     "mma.sync backward fp16 32x64 channel_first; atomic-dQ schedule, CTA 128 keys"),
    # fp32: exact FFMA kernels, key splits / shared key tiles on small grids...
    (H100, 1, 4, 400, 32, 64, "fp32", "psa", {"allow_tf32": False},
     "FFMA forward fp32 32x64 channel_first rows 16B; CTA 128 query rows x 64-key tiles, 7 "
     "CTA(s) per row tile",
     "FFMA backward fp32 32x64 channel_first; CTA 64 keys x 32-row steps, 6 CTA(s) per key tile"),
    (H100, 16, 8, 400, 32, 32, "fp32", "psa", {"allow_tf32": False},
     "FFMA forward fp32 32x32 channel_first rows 16B; CTA 128 query rows x 64-key tiles, 1 "
     "CTA(s) per row tile",
     "FFMA backward fp32 32x32 channel_first; CTA 64 keys x 32-row steps, 1 CTA(s) per key tile"),
    # ... under TF32 the TF32 forward, and the blockwise backward below 1600 tokens.
    (H100, 16, 4, 400, 32, 64, "fp32", "psa", {"allow_tf32": True},
     "TF32 mma.sync forward fp32 32x64 channel_first rows 16B; CTA 128 query rows x 64-key "
     "tiles, 1 CTA(s) per row tile",
     "blockwise backward on at::matmul (fp32: TF32 where allowed, deterministic)"),
    (H100, 16, 4, 1600, 32, 64, "fp32", "psa", {"allow_tf32": True},
     "TF32 mma.sync forward fp32 32x64 channel_first rows 16B; CTA 128 query rows x 64-key "
     "tiles, 1 CTA(s) per row tile",
     "FFMA backward fp32 32x64 channel_first; CTA 64 keys x 32-row steps, 1 CTA(s) per key tile"),
    (A100, 16, 4, 400, 32, 64, "fp32", "psa", {"allow_tf32": False, "deterministic": True},
     "FFMA forward fp32 32x64 channel_first rows 16B; CTA 128 query rows x 64-key tiles, 1 "
     "CTA(s) per row tile",
     "blockwise backward on at::matmul (fp32: TF32 where allowed, deterministic)"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[1:8])))
def test_plan_is_pinned(case):
    device, b, h, n, dk, dv, dtype, layout, options, fwd, bwd = case
    q, k, v = _plan.inputs(b, h, n, dk, dv, _plan.DTYPES[dtype], layout)
    assert _plan.plan("fwd", q, k, v, device=device, **options)[0] == fwd
    assert _plan.plan("bwd", q, k, v, device=device, **options)[0] == bwd


@pytest.mark.parametrize("dtype, dk, dv", [("fp64", 32, 64), ("bf16", 16, 16), ("bf16", 48, 48),
                                           ("fp16", 64, 128)])
def test_calls_without_a_fast_kernel_plan_the_reference_kernel(dtype, dk, dv):
    q, k, v = _plan.inputs(2, 4, 300, dk, dv, _plan.DTYPES[dtype], "token_major")
    for direction in ("fwd", "bwd"):
        description, fields = _plan.plan(direction, q, k, v, device=H100)
        assert description.startswith("reference"), description
        assert fields["no_fast_kernel"] and fields["instance"] == -1
        description, fields = _plan.plan(direction, q, k, v, device=H100, impl="reference")
        assert description.startswith("reference") and not fields["no_fast_kernel"]


def test_impl_reference_plans_the_reference_kernel_where_a_fast_one_exists():
    q, k, v = _plan.inputs(16, 4, 400, 32, 64, torch.bfloat16, "psa")
    assert _plan.plan("fwd", q, k, v, device=H100)[1]["instance"] >= 0
    for direction in ("fwd", "bwd"):
        description, fields = _plan.plan(direction, q, k, v, device=H100, impl="reference")
        assert description.startswith("reference") and fields["instance"] == -1


@pytest.mark.parametrize("batch, heads, launches", [(70000, 1, 2), (17500, 4, 2), (1, 70000, 2),
                                                    (3, 65536, 6), (65535, 1, 1)])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_calls_beyond_the_grids_65535_pairs_run_in_launches_of_the_same_kernel(
        batch, heads, launches, direction):
    """CUDA's grid holds at most 65535 (b, h) pairs in y: a larger call runs as launches of
    whole batches (or of one batch's heads), each planned as a call of its own."""
    q, k, v = _plan.inputs(batch, heads, 64, 32, 64, torch.bfloat16, "psa")
    description, fields = _plan.plan(direction, q, k, v, device=H100)
    assert fields["launches"] == launches
    assert fields["instance"] >= 0 and not fields["no_fast_kernel"], description
    first_heads = min(heads, 65535)
    first = _plan.inputs(min(batch, 65535 // first_heads), first_heads, 64, 32, 64,
                         torch.bfloat16, "psa")
    first_description, first_fields = _plan.plan(direction, *first, device=H100)
    assert first_fields["launches"] == 1 and first_fields["instance"] == fields["instance"]
    if launches > 1:
        assert description == first_description + f"; in {launches} launches, as the grid's y " \
            "dimension holds at most 65535 (b, h) pairs; the first launch's plan is shown"
    else:
        assert description == first_description


def test_forced_paths_change_only_what_they_name():
    q, k, v = _plan.inputs(16, 4, 400, 32, 64, torch.bfloat16, "psa")
    no_sm90 = _plan.plan("fwd", q, k, v, device=H100, force={"no_sm90": True})[0]
    assert no_sm90.startswith("mma.sync forward bf16 32x64 channel_first rows 16B")
    images = _plan.plan("fwd", q, k, v, device=H100,
                        force={"kv_images": "always", "kv_image_warpgroups": 3})[0]
    assert "K/V tile images; CTA 3 warpgroups" in images and "copies K, V to tile images" in images
    streamed = _plan.plan("bwd", q, k, v, device=H100, force={"stream_images": "always"})[0]
    assert "Q/dO stream images" in streamed
    q, k, v = _plan.inputs(1, 2, 62500, 32, 64, torch.bfloat16, "psa")
    plain = _plan.plan("fwd", q, k, v, device=H100, force={"no_copies": True})[0]
    assert "copies" not in plain and "K/V rows 8B" in plain
    q, k, v = _plan.inputs(1, 4, 400, 32, 64, torch.float32, "psa")
    one = _plan.plan("fwd", q, k, v, device=H100, allow_tf32=False,
                     force={"no_f32_kv_splits": True})[0]
    assert one.endswith("1 CTA(s) per row tile")
    with pytest.raises(ValueError, match="unknown plan override"):
        _plan.plan("fwd", q, k, v, device=H100, force={"no_such_thing": True})


def test_workspace_covers_the_dq_accumulators_and_the_tail_split():
    q, k, v = _plan.inputs(16, 4, 1600, 32, 64, torch.bfloat16, "psa")
    fields = _plan.plan("bwd", q, k, v, device=H100)[1]
    dq_bytes = 4 * 16 * 4 * 1600 * 32
    tail_tiles = 40  # the last wave's 40 tiles, each shared by 3 CTAs
    assert fields["tail_pieces"] == 3
    assert fields["workspace_bytes"] == dq_bytes + tail_tiles * 128 * 96 * 4 + 160
    fields = _plan.plan("bwd", q, k, v, device=H100, deterministic=True)[1]
    assert fields["workspace_bytes"] == 0


def test_plan_cli_prints_both_directions():
    import subprocess
    import sys
    result = subprocess.run(
        [sys.executable, "-m", "psa_fa2_ext", "--plan", "16", "4", "400", "32", "64", "bf16",
         "psa", "--device", "h100"], capture_output=True, text=True, check=True)
    lines = result.stdout.splitlines()
    assert lines[1].startswith("  fwd: wgmma forward") and lines[2].startswith("  bwd: wgmma")


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16", "fp64"])
def test_gpus_without_kernels_plan_blockwise(dtype):
    """A T4 (compute capability 7.5) runs none of the kernels: every call plans the blockwise
    path on at::matmul, impl="reference" included, and "auto" / "fast" say that no fast kernel
    runs (a one-time warning, an error for "fast")."""
    q, k, v = _plan.inputs(16, 4, 400, 32, 64, _plan.DTYPES[dtype], "psa")
    t4 = _plan.DEVICES["t4"]
    for impl in ("auto", "fast", "reference"):
        fwd, fwd_fields = _plan.plan("fwd", q, k, v, device=t4, impl=impl)
        bwd, bwd_fields = _plan.plan("bwd", q, k, v, device=t4, impl=impl)
        assert fwd.startswith("blockwise forward") and bwd.startswith("blockwise backward")
        assert fwd_fields["no_fast_kernel"] == bwd_fields["no_fast_kernel"] == (impl != "reference")
    forced = _plan.plan("fwd", q, k, v, device=H100, force={"as_if_no_kernels": True})[0]
    assert forced.startswith("blockwise forward")


FIT_DTYPES = ["bf16", "fp16", "fp32"]
FIT_DIMS = [(32, 64), (32, 32), (64, 64), (128, 128)]


@pytest.mark.parametrize("device_name", sorted(_plan.DEVICES))
def test_every_plan_fits_the_device(device_name):
    """Whatever the plan picks on a device fits its shared memory per CTA (the kernels hold no
    static shared memory; their registers per thread are capped by __launch_bounds__ at the
    64K registers a CTA may have on every GPU from sm_80 on), over every fast dtype, head
    dims, layout, N around the copies' thresholds, and both backward schedules."""
    device = _plan.DEVICES[device_name]
    picked = set()
    for dtype in FIT_DTYPES:
        for dk, dv in FIT_DIMS:
            for layout in _plan.LAYOUTS:
                for n in (400, 401, 1601, 6404, 12800):
                    q, k, v = _plan.inputs(2, 4, n, dk, dv, _plan.DTYPES[dtype], layout)
                    for tf32 in (False, True):
                        fields = _plan.plan("fwd", q, k, v, device=device, allow_tf32=tf32)[1]
                        assert fields["smem_bytes"] <= device[3], (dtype, dk, dv, layout, n)
                        picked.add(fields["instance"])
                        for deterministic in (False, True):
                            fields = _plan.plan("bwd", q, k, v, device=device, allow_tf32=tf32,
                                                deterministic=deterministic)[1]
                            assert fields["smem_bytes"] <= device[3], (dtype, dk, dv, layout, n)
    if device[5]:
        assert len(picked - {-1}) > 10  # the sweep reached the kernels, not only fallbacks


def test_every_kernel_caps_its_registers_and_static_shared_memory():
    """What lets test_every_plan_fits_the_device look at dynamic shared memory alone: every
    kernel declares __launch_bounds__, with which ptxas keeps registers x threads within the
    64K-register file of every GPU from sm_80 on (spilling rather than failing to launch), and
    static shared memory is only in the mma.sync backward's two helper kernels (D = rowsum and
    the dQ conversion: 32 KB at most, at (128, 128)), below the 48 KB any CTA has."""
    import pathlib
    import re
    kernels = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cuda"
    declared = []
    for path in sorted(kernels.rglob("*.cu*")):
        text = path.read_text()
        for match in re.finditer(r"__global__\s+void\s+(\w+)", text):
            declared.append((path.name, match.group(1)))
        statics = re.findall(r"(?<!extern )__shared__ [^;]*;", text)
        assert not statics or path.name == "bwd_sm80.cuh" and len(statics) == 2, (path.name, statics)
    # Only the empty probe kernel (device_support.cu) goes without launch bounds.
    assert [name for _, name in declared if name != "__launch_bounds__"] == ["probe_kernel"]
    assert len(declared) >= 15


def test_kernels_too_big_for_99_kb_fall_back_to_blockwise():
    """On 99 KB GPUs (RTX 30 / 40 / 50) the exact fp32 forward at (32, 64) (107.5 KB) and the
    mma.sync backward at (128, 128) (132 KB) do not fit: those calls run blockwise; on an A100
    (163 KB) the kernels run."""
    rtx, a100 = _plan.DEVICES["rtx4090"], _plan.DEVICES["a100"]
    q, k, v = _plan.inputs(16, 4, 400, 32, 64, torch.float32, "psa")
    description, fields = _plan.plan("fwd", q, k, v, device=rtx, allow_tf32=False)
    assert description == ("blockwise forward on at::matmul (no fast kernel fits the GPU's shared "
                           "memory)") and fields["no_fast_kernel"]
    assert _plan.plan("fwd", q, k, v, device=a100, allow_tf32=False)[0].startswith("FFMA forward")
    assert _plan.plan("fwd", q, k, v, device=rtx, allow_tf32=True)[0].startswith("TF32")
    q, k, v = _plan.inputs(2, 8, 1024, 128, 128, torch.bfloat16, "token_major")
    assert _plan.plan("bwd", q, k, v, device=rtx)[0].startswith("blockwise backward")
    assert _plan.plan("bwd", q, k, v, device=a100)[0].startswith("mma.sync backward")
    assert _plan.plan("fwd", q, k, v, device=rtx)[0].startswith("mma.sync forward")
    forced = _plan.plan("bwd", q, k, v, device=_plan.DEVICES["h100"],
                        force={"smem_per_block": 99 * 1024})[0]
    assert forced.startswith("blockwise backward")


@pytest.mark.parametrize("device", ["h100", "a100", "rtx4090"])
@pytest.mark.parametrize("seqlen", [1600, 1200, 28])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_area_views_plan_the_fast_kernels(device, seqlen, dtype):
    """psa_attention(..., area=4) hands the operators area views of the block's qkv (runs of
    400, 300 and 7 tokens: YOLO12's P4 at 640 x 640 and 640 x 480, and an odd run); they and
    the output laid out for them plan the kernel family area 1 plans, both directions: a fast
    one, fp32 included (exact fp32, the plan's default)."""
    for direction in ("fwd", "bwd"):
        q, k, v = _plan.inputs(16, 2, seqlen, 32, 32, dtype, "psa", area=4)
        description, fields = _plan.plan(direction, q, k, v, device=_plan.DEVICES[device], area=4)
        whole = _plan.plan(direction, *_plan.inputs(16, 2, seqlen, 32, 32, dtype, "psa"),
                           device=_plan.DEVICES[device])[1]
        assert fields["kernel"] == whole["kernel"], description
        assert fields["no_fast_kernel"] == whole["no_fast_kernel"], description
        assert not fields["no_fast_kernel"] and fields["instance"] >= 0, description
