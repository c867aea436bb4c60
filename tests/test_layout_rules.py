"""The layout rules exist twice: in csrc/layout.h (every C++ path) and in psa_fa2_ext/ops.py (the
fake kernels and the compiled autograd, which run on symbolic shapes). Both must answer alike:
which layout q, k, v share (or that they share none), and how the output is laid out."""
import pytest
import torch

from psa_fa2_ext import ops


def token_major(B, H, N, d):
    return torch.randn(B, H, N, d)


def channel_first(B, H, N, d):
    return torch.randn(B, H, d, N).transpose(2, 3)


def split_views(B, H, N, dk, dv):
    x = torch.randn(B, H, 2 * dk + dv, N)
    return [t.transpose(2, 3) for t in x.split([dk, dk, dv], dim=2)]


def strided_both(B, H, N, d):
    """Neither stride is 1."""
    return torch.randn(B, H, 2 * N, 2 * d)[:, :, ::2, ::2]


def heads_inside_tokens(B, H, N, d):
    """The head views of a [B, N, H * d] projection (nn.MultiheadAttention, AIFI)."""
    return torch.randn(B, N, H, d).transpose(1, 2)


def area_views(B, H, N, dk, dv, area=4):
    """psa_attention(..., area=4)'s operands: runs of N of the split views as heads."""
    return [t.flatten(0, 1).unflatten(2, (area, N // area)).transpose(1, 2).transpose(2, 3)
            for t in torch.randn(B, H, 2 * dk + dv, N).split([dk, dk, dv], dim=2)]


CASES = {
    "token_major": lambda: [token_major(2, 3, 17, 8), token_major(2, 3, 17, 8),
                            token_major(2, 3, 17, 4)],
    "channel_first": lambda: [channel_first(2, 3, 17, 8), channel_first(2, 3, 17, 8),
                              channel_first(2, 3, 17, 4)],
    "split_views": lambda: split_views(2, 3, 17, 8, 4),
    "one_token": lambda: [channel_first(2, 3, 1, 8), token_major(2, 3, 1, 8),
                          channel_first(2, 3, 1, 4)],
    "head_dim_one": lambda: [channel_first(2, 3, 17, 1), channel_first(2, 3, 17, 1),
                             token_major(2, 3, 17, 1)],
    "heads_inside_tokens": lambda: [heads_inside_tokens(2, 3, 17, 8),
                                    heads_inside_tokens(2, 3, 17, 8),
                                    heads_inside_tokens(2, 3, 17, 4)],
    "area_views": lambda: area_views(2, 3, 20, 8, 4),
    "mixed": lambda: [token_major(2, 3, 17, 8), channel_first(2, 3, 17, 8),
                      token_major(2, 3, 17, 4)],
    "neither": lambda: [strided_both(2, 3, 17, 8), strided_both(2, 3, 17, 8),
                        strided_both(2, 3, 17, 4)],
}


def layout_of_output(out):
    if out.stride(3) == 1 and (out.is_contiguous() or out.transpose(1, 2).is_contiguous()):
        return "token_major"
    if out.stride(2) == 1 and (out.transpose(2, 3).is_contiguous()
                               or out.permute(0, 3, 1, 2).is_contiguous()):
        return "channel_first"
    return f"unexpected strides {out.stride()}"


@pytest.mark.parametrize("case", CASES)
def test_python_and_cpp_layout_rules_agree(case):
    q, k, v = CASES[case]()
    python = ops._common_layout(q, k, v)
    if python is None:
        with pytest.raises(RuntimeError, match="share one layout"):
            torch.ops.psa_fa2.fwd(q, k, v, 0.5, "reference")
        return
    out, _ = torch.ops.psa_fa2.fwd(q, k, v, 0.5, "reference")
    assert layout_of_output(out) == python
    fake = ops._new_output(q, v.shape[3], python)
    assert fake.shape == out.shape and fake.stride() == out.stride()
    # Heads where q has them: inside the tokens or the head dim, else outermost (after B).
    if case == "heads_inside_tokens":
        assert out.transpose(1, 2).is_contiguous()
    elif case == "area_views":
        assert out.permute(0, 3, 1, 2).is_contiguous()
    for t in (q, k, v):
        assert ops._to_layout(t, python).data_ptr() == t.data_ptr()  # already in it: no copy


def test_every_case_is_covered():
    """The table holds both layouts, a tie broken to token-major, and both kinds of refusal."""
    answers = {case: ops._common_layout(*make()) for case, make in CASES.items()}
    assert answers["token_major"] == answers["one_token"] == "token_major"
    assert answers["channel_first"] == answers["split_views"] == "channel_first"
    assert answers["mixed"] is None and answers["neither"] is None
