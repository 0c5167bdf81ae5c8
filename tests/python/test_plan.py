"""create_mask_plan on CPU tensors: geometry, block classification vs a dense brute force, snapshots, PNG."""

import sys

import pytest
import torch
from conftest import cuda_ready
from criteria import check_tensor
from flex_ref import assert_close, dense_mask, make_problem


def dense_block_classes(p, hm, block_q, block_k):
    """int8 [Hm, NQB, NKB] from the dense mask: 0 empty, 1 partial, 2 full (all Bq x Bk in bounds and visible)."""
    masks = dense_mask(p.mask_func, p.cu_q, p.cu_k)
    nqb = [-(-(b - a) // block_q) for a, b in zip(p.cu_q, p.cu_q[1:])]
    nkb = [-(-(b - a) // block_k) for a, b in zip(p.cu_k, p.cu_k[1:])]
    qs, ks = [0], [0]
    for a, b in zip(nqb, nkb):
        qs.append(qs[-1] + a)
        ks.append(ks[-1] + b)
    grid = torch.zeros((hm, qs[-1], ks[-1]), dtype=torch.int8)
    for b, m in enumerate(masks):
        for i in range(nqb[b]):
            for j in range(nkb[b]):
                blk = m[:, i * block_q : (i + 1) * block_q, j * block_k : (j + 1) * block_k]
                in_bounds = blk.shape[1] == block_q and blk.shape[2] == block_k
                any_v = blk.flatten(1).any(1)
                all_v = blk.flatten(1).all(1) & in_bounds
                grid[:, qs[b] + i, ks[b] + j] = torch.where(all_v, 2, torch.where(any_v, 1, 0)).to(torch.int8)
    return grid


CASES = [
    dict(varlen=False, batch=2, seqlen_q=200, seqlen_k=300, hq=4, hkv=2, hm=1, nfunc=3),
    dict(varlen=False, batch=1, seqlen_q=256, seqlen_k=256, hq=2, hkv=2, hm=2, nfunc=1, mask="causal"),
    dict(varlen=True, batch=3, seqlen_q=[130, 1, 257], seqlen_k=[64, 190, 129], hq=4, hkv=1, hm=4, nfunc=5),
    dict(varlen=True, batch=2, seqlen_q=[0, 70], seqlen_k=[40, 0], hq=2, hkv=2, hm=1, nfunc=1),
    # Block-structured masks (flex_ref.block_visibility): full, empty, partial and full-minus-n tiles of
    # 128 x 128, so full blocks sit next to blocks missing a single element; nfunc follows from the mask.
    dict(varlen=False, batch=2, seqlen_q=300, seqlen_k=520, hq=4, hkv=2, hm=4, nfunc=None, mask="blocks"),
    dict(varlen=True, batch=3, seqlen_q=[257, 0, 130], seqlen_k=[384, 70, 200], hq=2, hkv=1, hm=1, nfunc=None,
         mask="blocks"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{'thd' if c['varlen'] else 'bshd'}-hm{c['hm']}-n{c['nfunc']}"
                         f"{'-' + c['mask'] if 'mask' in c else ''}")
def test_geometry_and_block_classes(fs, case):
    p = make_problem(7, dqk=16, dv=8, **case)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True, **p.plan_kwargs())
    hq, hm = case["hq"], case["hm"]
    assert plan.varlen == case["varlen"] and plan.layout == ("thd" if case["varlen"] else "bshd")
    assert plan.batch == case["batch"]
    assert (plan.num_heads_q, plan.num_heads_kv, plan.num_heads_mask) == (hq, case["hkv"], hm)
    assert (plan.nfunc, plan.head_dim_qk, plan.head_dim_v) == (p.mask_func.shape[1], 16, 8)
    if case["nfunc"] is not None:
        assert plan.nfunc == case["nfunc"]
    assert plan.total_q == p.cu_q[-1] and plan.total_k == p.cu_k[-1]
    assert plan.dtype == torch.float32 and plan.device == torch.device("cpu")
    assert plan.has_backward and plan.bytes > 0 and plan.signature
    assert plan.q_shape() == tuple(p.q.shape) and plan.k_shape() == tuple(p.k.shape)
    assert plan.v_shape() == tuple(p.v.shape)
    masks = dense_mask(p.mask_func, p.cu_q, p.cu_k)
    assert plan.visible_pairs == sum(int(m.sum()) for m in masks)
    for direction, bq, bk in (("fwd", plan.fwd_block_q, plan.fwd_block_k), ("bwd", plan.bwd_block_q, plan.bwd_block_k)):
        got = torch.from_numpy(plan.block_classes(direction))
        want = dense_block_classes(p, hm, bq, bk)
        assert torch.equal(got, want), f"{direction} block classes differ from the dense brute force"
        partial = plan.fwd_partial_blocks if direction == "fwd" else plan.bwd_partial_blocks
        full = plan.fwd_full_blocks if direction == "fwd" else plan.bwd_full_blocks
        assert (partial, full) == (int((want == 1).sum()), int((want == 2).sum()))
    info = plan.info()
    assert info["num_heads_q"] == hq and info["signature"] == plan.signature
    assert "MaskPlan(" in repr(plan)


def test_build_backward_default(fs):
    p = make_problem(1, batch=1, seqlen_q=16, seqlen_k=16, hq=2, hkv=2)
    assert not fs.create_mask_plan(p.mask_func, p.q, p.k, p.v).has_backward
    p.q.requires_grad_(True)
    assert fs.create_mask_plan(p.mask_func, p.q, p.k, p.v).has_backward
    with torch.no_grad():
        assert not fs.create_mask_plan(p.mask_func, p.q, p.k, p.v).has_backward
    assert not fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=False).has_backward
    p.q.requires_grad_(False)
    assert fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True).has_backward


@pytest.mark.parametrize("pack_gqa", [None, False, True])
@pytest.mark.parametrize("hm", [1, 6])
@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if cuda_ready() else []))
def test_pack_gqa_option_runs_correctly(fs, pack_gqa, hm, device, poison_uninitialized):
    # G = 3 and Sq = 33 < the forward query tile: None chooses packing. The CPU backend computes without
    # the plan's layout (this checks the option and the result); on a GPU the packed kernels run.
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    p = make_problem(2, batch=2, seqlen_q=33, seqlen_k=40, hq=6, hkv=2, hm=hm, dtype=dtype, device=device)
    if pack_gqa is True and hm != 1:
        # The seed's rule: an explicit pack_gqa=True needs a mask shared by all query heads.
        with pytest.raises(ValueError, match=r"pack_gqa=True needs a mask shared by all query heads \(Hmask = 1\)"):
            fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, pack_gqa=pack_gqa, build_backward=True)
        return
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, pack_gqa=pack_gqa, build_backward=True)
    assert plan.pack_gqa == (True if pack_gqa is None else pack_gqa)
    out = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan)
    if device == "cuda":
        check_tensor(out, p.reference(dtype=torch.float32)[0], dtype, "out")
    else:
        assert_close(out, p.reference()[0], torch.float32, "out")


def test_pack_gqa_default_rule(fs):
    """None packs only GQA groups (G > 1) with short queries (Sq < the forward query tile)."""
    p = make_problem(4, batch=1, seqlen_q=200, seqlen_k=64, hq=4, hkv=2)
    assert not fs.create_mask_plan(p.mask_func, p.q, p.k, p.v).pack_gqa  # Sq >= tile
    assert fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, pack_gqa=True).pack_gqa
    p = make_problem(5, batch=1, seqlen_q=9, seqlen_k=64, hq=4, hkv=4)
    assert not fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, pack_gqa=True).pack_gqa  # G = 1: identity


def test_pack_gqa_decode_tile(fs):
    """Packed decode plans (max Sq * G <= 16, head dims <= 128) take the 16 x 64 forward tile; the
    backward tile, unpacked plans, longer queries and larger head dims keep the default tiles."""
    p = make_problem(6, batch=2, seqlen_q=2, seqlen_k=300, hq=8, hkv=1, hm=8)  # G = 8: 16 packed rows
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, build_backward=True)
    assert plan.pack_gqa and (plan.fwd_block_q, plan.fwd_block_k) == (16, 64)
    assert (plan.bwd_block_q, plan.bwd_block_k) == (64, 128)
    assert plan.info()["fwd_block_q"] == 16 and "fwd 16x64 bwd 64x128" in plan.signature
    assert plan.fwd_num_q_blocks == 2 and plan.num_tasks == 2  # one packed block per (sample, kv head)
    assert_close(fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan), p.reference()[0], torch.float32, "out")
    p = make_problem(8, varlen=True, batch=3, seqlen_q=[1, 0, 4], seqlen_k=[50, 9, 70], hq=8, hkv=2)  # G = 4
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, **p.plan_kwargs())
    assert plan.pack_gqa and plan.fwd_block_q == 16
    assert_close(fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan), p.reference()[0], torch.float32, "out")
    for kwargs, pack in ((dict(seqlen_q=9, hq=4, hkv=2), None),  # 18 packed rows
                         (dict(seqlen_q=1, hq=8, hkv=2), False),  # not packed
                         (dict(seqlen_q=1, hq=8, hkv=2, dqk=192, dv=128), None)):  # head dims > 128
        p = make_problem(9, batch=1, seqlen_k=64, **kwargs)
        plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, pack_gqa=pack)
        assert plan.fwd_block_q == 128, kwargs


def test_plan_owns_copies_of_its_inputs(fs):
    p = make_problem(3, varlen=True, batch=2, seqlen_q=[10, 20], seqlen_k=[15, 12], hq=2, hkv=2, nfunc=3)
    mf = p.mask_func.clone()
    plan = fs.create_mask_plan(mf, p.q, p.k, p.v, **p.plan_kwargs())
    before = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan)
    mf.zero_()
    p.cu_seqlens_q[1] = 5  # mutate the caller's tensors: the plan must not see it
    after = fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan)
    assert torch.equal(before, after)
    snap = plan.debug_snapshot()
    assert snap["cu_seqlens_q"].tolist() == [0, 10, 30]
    assert plan.array("cu_seqlens_q").tolist() == [0, 10, 30]


def test_max_seqlen_defaults_from_cu_seqlens(fs):
    p = make_problem(4, varlen=True, batch=2, seqlen_q=[10, 20], seqlen_k=[15, 12], hq=2, hkv=2)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, cu_seqlens_q=p.cu_seqlens_q, cu_seqlens_k=p.cu_seqlens_k)
    assert (plan.max_seqlen_q, plan.max_seqlen_k) == (20, 15)


def test_noncontiguous_mask_func_is_accepted(fs):
    p = make_problem(5, batch=2, seqlen_q=16, seqlen_k=16, hq=2, hkv=2, hm=2, nfunc=3)
    mf = p.mask_func.transpose(0, 1).contiguous().transpose(0, 1)
    assert not mf.is_contiguous()
    plan = fs.create_mask_plan(mf, p.q, p.k, p.v)
    assert_close(fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan), p.reference()[0], torch.float32, "out")


def test_arrays(fs):
    p = make_problem(6, batch=2, seqlen_q=150, seqlen_k=100, hq=2, hkv=1, hm=2, nfunc=3, requires_grad=True)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    snap = plan.arrays()
    assert set(snap) == set(plan.array_names())
    for name in ("cu_seqlens_q", "cu_seqlens_k", "fwd_q2k_partial_ptr", "fwd_q2k_full_ptr", "fwd_tasks",
                 "bwd_k2q_partial_ptr", "mask_func"):
        assert name in snap, name
    assert all(a.dtype.name == "int32" for a in snap.values())
    assert snap["cu_seqlens_k"].tolist() == [0, 100, 200]
    nqb = int(snap["fwd_q_block_start"][-1])
    assert snap["fwd_q2k_partial_ptr"].shape == (2 * nqb + 1,)
    assert snap["fwd_q2k_partial_ptr"][-1] == plan.fwd_partial_blocks
    runs = snap["fwd_q2k_full_runs"].reshape(-1, 2)
    assert runs.shape[0] == snap["fwd_q2k_full_ptr"][-1]
    assert int((runs[:, 1] - runs[:, 0]).sum()) == plan.fwd_full_blocks
    assert snap["fwd_tasks"].size == 4 * plan.num_tasks
    assert torch.equal(torch.from_numpy(snap["mask_func"]).view_as(p.mask_func), p.mask_func)
    with pytest.raises(ValueError, match="no array named 'nope'"):
        plan.array("nope")


def test_visualize_png(fs, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib not installed (pip install flashspan[plot])")
    p = make_problem(8, batch=1, seqlen_q=300, seqlen_k=300, hq=2, hkv=2, hm=2, nfunc=3)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    path = tmp_path / "plan.png"
    plan.visualize(str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    with pytest.raises(ValueError, match="no backward metadata"):
        plan.visualize(str(tmp_path / "bwd.png"), direction="bwd")


@pytest.mark.parametrize("seqlen,hm", [(200, 1), (300, 2)])
def test_visualize_layout(fs, tmp_path, monkeypatch, seqlen, hm):
    """Nothing is cut off or overlapping, and block ticks are integers (a user report: the y label
    was cut off at the left, ticks ran -0.5..1.5, the panel title crowded the figure title)."""
    pytest.importorskip("matplotlib", reason="matplotlib not installed (pip install flashspan[plot])")
    from matplotlib.figure import Figure

    saved = []
    real_savefig = Figure.savefig

    def capture(fig, *args, **kwargs):
        real_savefig(fig, *args, **kwargs)  # draws the figure, so the text extents are final
        # Measure now: visualize() closes the figure, which detaches its Agg renderer.
        saved.append((fig, fig.canvas.get_renderer()))

    monkeypatch.setattr(Figure, "savefig", capture)
    p = make_problem(9, batch=1, seqlen_q=seqlen, seqlen_k=seqlen, hq=hm, hkv=hm, hm=hm, nfunc=3)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    plan.visualize(str(tmp_path / "plan.png"))
    ((fig, renderer),) = saved
    page = fig.bbox
    title = fig._suptitle.get_window_extent(renderer)
    axes = fig.get_axes()
    assert len(axes) == hm
    for ax in axes:
        for label in (ax.yaxis.label, ax.xaxis.label, ax.title):
            box = label.get_window_extent(renderer)
            assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, \
                f"{label.get_text()!r} is cut off: {box} outside {page}"
        assert not title.overlaps(ax.title.get_window_extent(renderer)), "figure title overlaps a panel title"
        for ticks in (ax.get_xticks(), ax.get_yticks()):
            shown = [t for t in ticks if -0.5 <= t]
            assert shown and all(float(t).is_integer() for t in shown), f"fractional block ticks {list(ticks)}"
    assert title.y1 <= page.y1 and title.x0 >= page.x0


def test_visualize_without_matplotlib(fs, tmp_path, monkeypatch):
    p = make_problem(8, batch=1, seqlen_q=64, seqlen_k=64, hq=1, hkv=1)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match="visualize needs matplotlib"):
        plan.visualize(str(tmp_path / "x.png"))


def test_plan_arch_choice(fs):
    """arch picks the kernel family a plan is laid out for (tiles follow it); CPU plans default to 80;
    a value other than 80 / 90 / None is a ValueError naming arch."""
    p = make_problem(12, batch=1, seqlen_q=200, seqlen_k=300, hq=2, hkv=1, dqk=64, dv=64)
    plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
    assert plan.arch == 80 and (plan.fwd_block_q, plan.fwd_block_k) == (128, 64)
    plan90 = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, arch=90, build_backward=True)
    assert plan90.arch == 90 and (plan90.fwd_block_q, plan90.fwd_block_k) == (128, 128)
    # (64, 64): the wide 128 x 128 backward tile in builds with the sm90 backward (tile_sm90.h,
    # unless FLASHSPAN_SM90_BWD_WIDE64=0 or the sm90 backward is off), else 64 x 128.
    assert (plan90.bwd_block_q, plan90.bwd_block_k) in ((128, 128), (64, 128))
    assert_close(fs.flex_attn_func(p.q, p.k, p.v, plan90), p.reference()[0], torch.float32, "out")
    with pytest.raises(ValueError, match="arch"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, arch=81)


@pytest.mark.parametrize("dqk,dv,fwd_tile,bwd_tiles", [(192, 128, (128, 128), ((64, 96), (64, 64))),
                                                      (256, 256, (128, 64), ((64, 64),)),
                                                      (40, 72, (128, 128), ((64, 128),))])
def test_plan_arch90_head_dim_tiles(fs, dqk, dv, fwd_tile, bwd_tiles):
    """sm90 plans take the tiles of kernels/sm90/tile_sm90.h for their head dims: 128 x 64 forward
    for (256, 256); the backward tile is the one their backward runs on (the sm80 kernels' 64 x 64
    for (256, 256); for (192, 128) the sm90 backward's 64 x 96 in builds with it, unless
    FLASHSPAN_SM90_BWD_WIDE192=0 or the sm90 backward is off, else 64 x 64). Such a plan runs on the
    CPU backend too."""
    p = make_problem(14, batch=1, seqlen_q=150, seqlen_k=170, hq=2, hkv=1, dqk=dqk, dv=dv)
    plan90 = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, arch=90, build_backward=True)
    assert plan90.arch == 90
    assert (plan90.fwd_block_q, plan90.fwd_block_k) == fwd_tile
    assert (plan90.bwd_block_q, plan90.bwd_block_k) in bwd_tiles
    plan80 = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v, arch=80, build_backward=True)
    if dqk > 128:
        assert (plan80.bwd_block_q, plan80.bwd_block_k) == (64, 64)
    assert_close(fs.flex_attn_func(p.q, p.k, p.v, mask_plan=plan90), p.reference()[0], torch.float32, "out")


def test_kernel_family_environment(fs, monkeypatch):
    """FLASHSPAN_KERNEL_FAMILY picks the family of plans built with arch=None: sm80 forces the
    portable family; another value is an error naming the variable. (CPU plans are 80 under auto.)"""
    p = make_problem(13, batch=1, seqlen_q=150, seqlen_k=140, hq=2, hkv=2, dqk=64, dv=64)
    for value in ("sm80", "auto", "sm90", ""):
        monkeypatch.setenv("FLASHSPAN_KERNEL_FAMILY", value)
        plan = fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
        if value == "sm80" or not p.q.is_cuda:
            assert plan.arch == 80, value
        else:  # 90 on an sm_90 device with a 90a build, else 80
            assert plan.arch in (80, 90), value
    monkeypatch.setenv("FLASHSPAN_KERNEL_FAMILY", "sm70")
    with pytest.raises(ValueError, match="FLASHSPAN_KERNEL_FAMILY"):
        fs.create_mask_plan(p.mask_func, p.q, p.k, p.v)
