"""L0 contracts of the Python API: exports, return tuples, option handling, and every error rule."""

import gc

import pytest
import torch
from flex_ref import make_problem


def test_exports(fs):
    for name in ("create_mask_plan", "MaskPlan", "flex_attn_func", "FlexAttentionFwd", "FlexAttentionBwd"):
        assert name in fs.__all__ and hasattr(fs, name)
    assert isinstance(fs.__version__, str) and fs.__version__.count(".") == 2
    import flashspan._lib as lib

    assert lib.version() == fs.__version__, "package and library versions differ"


def test_masks_module_is_exported(fs):
    try:
        m = fs.masks
    except ImportError as e:  # written by another module owner; may be absent in a partial checkout
        pytest.skip(f"flashspan.masks not importable: {e}")
    assert m.__name__ == "flashspan.masks"


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("return_max_logit", [False, True])
def test_return_tuples(fs, return_lse, return_max_logit):
    p = make_problem(1, batch=2, seqlen_q=10, seqlen_k=12, hq=4, hkv=2, dqk=16, dv=8)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    r = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=return_lse, return_max_logit=return_max_logit)
    out_shape, lse_shape, ml_shape = (2, 10, 4, 8), (2, 4, 10), (4,)
    if not return_lse and not return_max_logit:
        assert isinstance(r, torch.Tensor) and r.shape == out_shape
        return
    assert isinstance(r, tuple)
    want = [out_shape] + ([lse_shape] if return_lse else []) + ([ml_shape] if return_max_logit else [])
    assert [tuple(t.shape) for t in r] == want
    assert r[0].dtype == p.q.dtype and all(t.dtype == torch.float32 for t in r[1:])


def test_thd_return_shapes(fs):
    p = make_problem(2, varlen=True, batch=3, seqlen_q=[5, 9, 3], seqlen_k=[7, 2, 11], hq=2, hkv=1)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **p.plan_kwargs())
    out, lse, ml = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=True, return_max_logit=True)
    assert out.shape == (17, 2, 16) and lse.shape == (2, 17) and ml.shape == (2,)


def test_max_logit_is_not_differentiable(fs):
    p = make_problem(3, batch=1, seqlen_q=8, seqlen_k=8, hq=2, hkv=2, requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    out, lse, ml = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, return_lse=True, return_max_logit=True)
    assert out.requires_grad and lse.requires_grad and not ml.requires_grad


# ---------------------------------------------------------------------------
# Errors: each rule -> exception type and a message naming the argument
# ---------------------------------------------------------------------------


def _bshd(seed=0, **kw):
    return make_problem(seed, batch=2, seqlen_q=8, seqlen_k=8, hq=4, hkv=2, **kw)


def _set_kv_heads(p, heads):
    p.k = p.k[:, :, :1].expand(-1, -1, heads, -1)
    p.v = p.v[:, :, :1].expand(-1, -1, heads, -1)


@pytest.mark.parametrize(
    "mutate,exc,text",
    [
        (lambda p: setattr(p, "mask_func", p.mask_func.long()), TypeError, "mask_func: dtype must be int32"),
        (lambda p: setattr(p, "mask_func", p.mask_func[:, :2]), ValueError, "nfunc (dim 1) must be positive and odd"),
        (lambda p: setattr(p, "mask_func", p.mask_func.expand(3, -1, -1)), ValueError, "Hmask (dim 0) must be 1 or Hq"),
        (lambda p: setattr(p, "mask_func", p.mask_func[:, :, :-1]), ValueError, "mask_func: length (dim 2)"),
        (lambda p: setattr(p, "mask_func", p.mask_func[0]), ValueError, "mask_func: must have rank 3"),
        (lambda p: setattr(p, "k", p.k.half()), TypeError, "k: dtype"),
        (lambda p: setattr(p, "q", p.q.double()), TypeError, "q"),
        (lambda p: _set_kv_heads(p, 3), ValueError, "Hq % Hkv must be 0"),
        (lambda p: setattr(p, "v", p.v[:, :, :1]), ValueError, "v: number of heads 1 differs from k"),
        (lambda p: setattr(p, "k", p.k[..., :8]), ValueError, "k: head dim"),
        (lambda p: setattr(p, "q", p.q[0]), ValueError, "q: must have rank"),
        (lambda p: setattr(p, "v", p.v[:1]), ValueError, "v: batch"),
    ],
)
def test_plan_argument_errors(fs, mutate, exc, text):
    p = _bshd(nfunc=3)
    mutate(p)
    with pytest.raises(exc, match=_re(text)):
        fs.create_mask_plan(p.mask_func.contiguous(), p.q, p.k, p.v)


def _re(text):
    import re

    return re.escape(text)


@pytest.mark.parametrize(
    "value,text",
    [(-1, "= -1 is negative"), (9, "= 9 is past the sample's key length 8"), ("decreasing", "must be nondecreasing")],
)
def test_endpoint_errors(fs, value, text):
    p = _bshd(nfunc=3)
    mf = p.mask_func.clone()
    if value == "decreasing":
        mf[0, 0, 5], mf[0, 1, 5] = 6, 2
    else:
        mf[0, 1, 5] = value
        mf[0, 2, 5] = max(value, mf[0, 2, 5].item())
    with pytest.raises(ValueError, match=_re("mask_func[0, 1, 5] (sample 0, query 5)")) as ei:
        fs.create_mask_plan(mf, p.q, p.k, p.v)
    assert text in str(ei.value)


def test_head_dim_not_supported(fs):
    # A ValueError at create_mask_plan (the seed's rule), not a plan that fails later.
    p = make_problem(0, batch=1, seqlen_q=8, seqlen_k=8, hq=1, hkv=1, dqk=12, dv=16)
    with pytest.raises(ValueError, match="head_dim_qk: must be a multiple of 8"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    p = make_problem(0, batch=1, seqlen_q=8, seqlen_k=8, hq=1, hkv=1, dqk=16, dv=264)
    with pytest.raises(ValueError, match="head_dim_v: must be a multiple of 8 in \\[8, 256\\], got 264"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)


def test_unsupported_device_names_the_call_and_tensor(fs):
    p = _bshd()
    with pytest.raises(TypeError, match=r"^create_mask_plan: q: device meta is not supported \(CPU or CUDA tensors only\)"):
        fs.create_mask_plan(p.mask_func, p.q.to("meta"), p.k, p.v)
    with pytest.raises(TypeError, match=r"^create_mask_plan: mask_func: device meta is not supported"):
        fs.create_mask_plan(p.mask_func.to("meta"), p.q, p.k, p.v)


def test_tensors_on_two_devices_are_a_type_error(fs, monkeypatch):
    """A tensor on another device than q is a TypeError (docs/ERRORS.md, as a device kind the library has no code
    for, above), in both front ends, naming the tensor and both devices. No GPU needed: the descriptor of one tensor
    is made to say cuda:0."""
    from flashspan import _lib

    real = _lib._fs_device

    def one_on_cuda(name):
        def fake(device, n):
            return _lib.FsDevice(_lib.DEVICE_CUDA, 0) if n.endswith(name) else real(device, n)
        return fake

    p = _bshd()
    monkeypatch.setattr(_lib, "_fs_device", one_on_cuda("k"))
    with pytest.raises(TypeError, match=r"^create_mask_plan: k: must be on the same device as q \(cpu:0\), got cuda:0"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    q = torch.randn(1, 2, 16, 8)
    lens = torch.full((1, 1, 1, 1), 16, dtype=torch.int32)
    monkeypatch.setattr(_lib, "_fs_device", one_on_cuda("seq_len_q"))
    with pytest.raises(TypeError, match=r"^seq_len_q: must be on the device of q \(cpu:0\), got cuda:0"):
        fs.sdpa(q, q, q, seq_len_q=lens, seq_len_kv=lens, use_padding_mask=True)


def test_unknown_dtype_lists_the_ones_the_library_takes(fs):
    q = torch.randn(1, 2, 16, 8)
    with pytest.raises(TypeError, match=r"^q: dtype torch.bool is not supported by flashspan \(tensors of float16, "
                                        r"bfloat16, float32, float64, "):
        fs.sdpa(q.bool(), q, q)


def test_v_heads_must_equal_k_heads(fs):
    p = _bshd()  # Hq = 4, Hkv = 2
    v = torch.cat([p.v, p.v], dim=2)
    with pytest.raises(ValueError, match=r"^create_mask_plan: v: number of heads 4 differs from k's 2 \(K and V share "
                                         r"one head count, Hkv\)"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, v)


def test_thd_errors(fs):
    p = make_problem(0, varlen=True, batch=2, seqlen_q=[4, 6], seqlen_k=[5, 5], hq=2, hkv=2)
    kw = p.plan_kwargs()
    with pytest.raises(ValueError, match="cu_seqlens_q and cu_seqlens_k must be given together"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, cu_seqlens_q=kw["cu_seqlens_q"])
    bad = dict(kw, cu_seqlens_q=torch.tensor([0, 6, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match="cu_seqlens_q: must be nondecreasing"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **bad)
    bad = dict(kw, cu_seqlens_q=kw["cu_seqlens_q"].to(torch.int16))  # int64 is taken, as SDPA takes it
    with pytest.raises(TypeError, match="cu_seqlens_q: dtype must be int32 or int64, got int16"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **bad)
    bad = dict(kw, max_seqlen_q=3)
    with pytest.raises(ValueError, match="longer than max_seqlen_q"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **bad)
    bad = dict(kw, cu_seqlens_k=torch.tensor([0, 5, 9], dtype=torch.int32))
    with pytest.raises(ValueError, match="cu_seqlens_k: must end at the total length 10"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **bad)


def test_not_a_tensor(fs):
    p = _bshd()
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        fs.create_mask_plan(p.mask_func, p.q.numpy(), p.k, p.v)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    with pytest.raises(TypeError, match="mask_plan must be a flashspan.MaskPlan"):
        fs.flex_attn_func(p.q, p.k, p.v, mask_plan="plan")
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        fs.flex_attn_func(p.q, None, p.v, mask_plan=plan)


def test_incompatible_plan_reuse(fs):
    p = _bshd()
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    other = make_problem(1, batch=2, seqlen_q=9, seqlen_k=8, hq=4, hkv=2)
    msg = "q has shape (2, 9, 4, 16) but the mask plan was built for (2, 8, 4, 16)"
    with pytest.raises(ValueError, match=_re(msg)):
        fs.flex_attn_func(other.q, other.k, other.v, mask_plan=plan)
    with pytest.raises(TypeError, match="q has dtype torch.float16 but the mask plan was built for torch.float32"):
        fs.flex_attn_func(p.q.half(), p.k.half(), p.v.half(), mask_plan=plan)
    thd = make_problem(0, varlen=True, batch=2, seqlen_q=[8, 8], seqlen_k=[8, 8], hq=4, hkv=2)
    with pytest.raises(ValueError, match="BSHD"):
        fs.flex_attn_func(thd.q, thd.k, thd.v, mask_plan=plan)


def test_plan_reuse_errors_name_the_entry_point(fs):
    """Every reuse error of flex_attn_func starts with the function the user called."""
    p = _bshd(requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=False)
    other = make_problem(1, batch=2, seqlen_q=9, seqlen_k=8, hq=4, hkv=2)
    with pytest.raises(ValueError, match=r"^flex_attn_func: q has shape \(2, 9, 4, 16\) but the mask plan"):
        fs.flex_attn_func(other.q, other.k, other.v, mask_plan=plan)
    with pytest.raises(TypeError, match=r"^flex_attn_func: k has dtype torch.float16"):
        fs.flex_attn_func(p.q, p.k.half(), p.v, mask_plan=plan)
    with pytest.raises(TypeError, match=r"^flex_attn_func: v must be a torch.Tensor"):
        fs.flex_attn_func(p.q, p.k, None, mask_plan=plan)
    with pytest.raises(ValueError, match=r"^flex_attn_func: mask_plan was built without backward metadata"):
        fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan)
    with pytest.raises(TypeError, match=r"^flex_attn_func: mask_plan must be a flashspan.MaskPlan"):
        fs.flex_attn_func(p.q, p.k, p.v, mask_plan=None)
    plan.close()
    with pytest.raises(ValueError, match=r"^flex_attn_func: mask_plan: this MaskPlan was closed"):
        fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan)


@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_shape_error_names_the_tensor(fs, which):
    p = make_problem(0, varlen=True, batch=2, seqlen_q=[4, 6], seqlen_k=[5, 5], hq=2, hkv=2)
    kw = p.plan_kwargs()
    kw.pop("max_seqlen_q", None)
    kw.pop("max_seqlen_k", None)
    kw[which] = torch.stack([kw[which], kw[which]])  # 2-D, not a vector ((1, B+1) is taken, as SDPA takes it)
    with pytest.raises(ValueError, match=rf"^create_mask_plan: {which}: must be a 1-D tensor of B\+1 >= 2 values "
                                         rf"\(or a vector with unit dimensions, e.g. \(1, B\+1\)\), got shape \(2, 3\)"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **kw)


@pytest.mark.parametrize("value", [6.5, 6.0, True, "6", torch.tensor(6.0)])
@pytest.mark.parametrize("which", ["max_seqlen_q", "max_seqlen_k"])
@pytest.mark.parametrize("varlen", [True, False])
def test_max_seqlen_must_be_an_int(fs, which, value, varlen):
    """A float max_seqlen used to be truncated silently (64.5 -> 64)."""
    if varlen:
        p = make_problem(0, varlen=True, batch=2, seqlen_q=[4, 6], seqlen_k=[5, 6], hq=2, hkv=2)
        kw = dict(p.plan_kwargs(), max_seqlen_q=6, max_seqlen_k=6)
    else:
        p, kw = _bshd(), {}
    kw[which] = value
    with pytest.raises(TypeError, match=rf"^create_mask_plan: {which} must be an int or None, got {type(value).__name__}"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **kw)


def test_max_seqlen_accepts_integer_like(fs):
    import numpy as np

    p = make_problem(0, varlen=True, batch=2, seqlen_q=[4, 6], seqlen_k=[5, 6], hq=2, hkv=2)
    kw = dict(p.plan_kwargs(), max_seqlen_q=np.int64(6), max_seqlen_k=torch.tensor(6))
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **kw)
    assert plan.max_seqlen_q == 6 and plan.max_seqlen_k == 6


def test_forward_only_plan_in_grad_call(fs):
    p = _bshd(requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=False)
    assert not plan.has_backward
    with pytest.raises(ValueError, match="built without backward metadata.*build_backward=True"):
        fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan)
    with torch.no_grad():
        fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan)  # fine without gradients


def test_max_logit_needs_nonnegative_scale(fs):
    p = _bshd()
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    with pytest.raises(ValueError, match="softmax_scale: must be non-negative when max_logit is requested"):
        fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, softmax_scale=-0.5, return_max_logit=True)
    fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, softmax_scale=-0.5)  # allowed without max_logit
    with pytest.raises(ValueError, match="softmax_scale: must be a finite number"):
        fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, softmax_scale=float("nan"))


def test_scale_past_float32_is_named_by_the_called_function(fs):
    # The C ABI takes the scale as a float32: 1e40 became inf on the way and was refused as
    # "FlexAttentionFwd.execute: softmax_scale: must be finite, got inf" (another function, another value).
    p = _bshd()
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    for scale, shown in ((1e40, r"1e\+40"), (-1e39, r"-1e\+39"), (10**400, r"1000")):
        with pytest.raises(ValueError, match=rf"^flex_attn_func: softmax_scale: {shown}.* does not fit float32 "
                                             r"\(must be finite as float32\)"):
            fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, softmax_scale=scale)
    out = torch.empty_like(p.q)
    lse = torch.empty(p.q.shape[0], p.q.shape[2], p.q.shape[1])
    fwd = fs.FlexAttentionFwd(p.q, p.k, p.v, out, plan, lse)
    fwd.compile()
    with pytest.raises(ValueError, match=r"^FlexAttentionFwd\.execute: softmax_scale: 1e\+40 does not fit float32"):
        fwd.execute(p.q, p.k, p.v, out, plan, lse, softmax_scale=1e40)
    fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan, softmax_scale=3.4028234663852886e38)  # FLT_MAX itself fits


def test_last_dim_must_be_contiguous(fs):
    p = _bshd()
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    q = p.q.transpose(-1, -2).contiguous().transpose(-1, -2)
    with pytest.raises(ValueError, match="q: .*contiguous"):
        fs.flex_attn_func(q, p.k, p.v, mask_plan=plan)


def test_closed_plan(fs):
    p = _bshd()
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    plan.close()
    plan.close()  # idempotent
    assert "closed" in repr(plan)
    with pytest.raises(ValueError, match="MaskPlan was closed"):
        fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan)
    with pytest.raises(ValueError, match="MaskPlan was closed"):
        plan.debug_snapshot()


def test_plan_is_immutable_and_not_constructible(fs):
    p = _bshd()
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    with pytest.raises(AttributeError):
        plan.batch = 3
    with pytest.raises(AttributeError):
        plan._handle = None
    with pytest.raises(TypeError, match="create_mask_plan"):
        fs.MaskPlan()
    import copy
    import pickle

    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        pickle.dumps(plan)
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        copy.copy(plan)


def test_plan_ids_resolve_only_live_plans(fs):
    from flashspan.plan import plan_from_id

    p = _bshd()
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    pid = plan.id
    assert plan_from_id(pid) is plan
    del plan
    gc.collect()
    with pytest.raises(ValueError, match=f"MaskPlan with id {pid} no longer exists"):
        plan_from_id(pid)


def test_error_message_from_c_layer_is_carried(fs):
    import flashspan._lib as lib

    with pytest.raises(ValueError, match="create_mask_plan: "):
        p = _bshd(nfunc=3)
        fs.create_mask_plan(p.mask_func[:, :2].contiguous(), p.q, p.k, p.v)
    assert "nfunc" in lib.last_error()


def _run_python(code, env_extra):
    import os
    import subprocess
    import sys

    env = dict(os.environ, **env_extra)
    paths = [os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_library_env_override_missing_file():
    r = _run_python(
        "import flashspan\n"
        "try:\n"
        "    flashspan.create_mask_plan\n"
        "    import flashspan._lib as L; L.lib()\n"
        "except ImportError as e:\n"
        "    print('IMPORT_ERROR', e)\n",
        {"FLASHSPAN_LIBRARY": "/nonexistent/libflashspan.so"},
    )
    assert r.returncode == 0, r.stderr
    assert "IMPORT_ERROR" in r.stdout and "FLASHSPAN_LIBRARY='/nonexistent/libflashspan.so' does not exist" in r.stdout


def test_library_path_is_reported(fs):
    import os

    import flashspan._lib as lib

    path = lib.library_path()
    assert os.path.exists(path) and ".so" in os.path.basename(path)
    if os.environ.get("FLASHSPAN_LIBRARY"):
        assert os.path.samefile(path, os.environ["FLASHSPAN_LIBRARY"])
    assert isinstance(lib.cuda_available(), bool)
    assert all(a for a in lib.built_cuda_archs())


def test_library_that_is_not_a_library(tmp_path):
    bad = tmp_path / "libflashspan.so"
    bad.write_text("not an ELF file")
    r = _run_python(
        "import flashspan._lib as L\n"
        "try:\n"
        "    L.lib()\n"
        "except ImportError as e:\n"
        "    print('IMPORT_ERROR', e)\n",
        {"FLASHSPAN_LIBRARY": str(bad)},
    )
    assert r.returncode == 0, r.stderr
    assert "IMPORT_ERROR flashspan: cannot load" in r.stdout
