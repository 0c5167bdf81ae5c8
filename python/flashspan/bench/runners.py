"""The contenders: flashspan (explicit, allocation-free API), PyTorch FlexAttention, PyTorch SDPA.

Every runner prepares once (``prepare``), then exposes ``forward``, ``backward`` and
``combined`` zero-argument callables for the timer and ``outputs()`` for the spot-check.
A runner that cannot run a workload raises :class:`Unavailable` with the reason; the
driver records it and moves on.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Optional

import torch

from .timing import Timer, Timing
from .workloads import Workload


class Unavailable(Exception):
    """This backend cannot run this workload here (the message says why)."""


class Inputs:
    """q, k, v, dout of one workload in BSHD (flashspan's layout), random normal, never zero."""

    def __init__(self, wl: Workload, dtype: torch.dtype, device: torch.device, seed: int):
        g = torch.Generator(device=device).manual_seed(seed)
        b, s = wl.batch, wl.seqlen

        def rnd(*shape):
            return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)

        self.q = rnd(b, s, wl.heads_q, wl.head_dim_qk)
        self.k = rnd(b, s, wl.heads_kv, wl.head_dim_qk)
        self.v = rnd(b, s, wl.heads_kv, wl.head_dim_v)
        self.do = rnd(b, s, wl.heads_q, wl.head_dim_v)
        self.scale = 1.0 / math.sqrt(wl.head_dim_qk)

    def bhsd(self, requires_grad: bool):
        """Contiguous [B,H,S,D] copies for the PyTorch peers (their native layout)."""
        def cp(t):
            return t.transpose(1, 2).contiguous().requires_grad_(requires_grad)
        return cp(self.q), cp(self.k), cp(self.v), self.do.transpose(1, 2).contiguous()


class Runner:
    name = "runner"
    #: extra timings of the preparation (plan build, block mask), filled by prepare()
    prep_timings: dict

    def __init__(self, wl: Workload, inputs: Inputs, timer: Timer):
        self.wl = wl
        self.inp = inputs
        self.timer = timer
        self.prep_timings = {}
        self.first_call_ms: dict[str, float] = {}

    def prepare(self, phases) -> None:
        raise NotImplementedError

    def context(self):
        return contextlib.nullcontext()

    def fn(self, phase: str) -> Callable[[], object]:
        return {"forward": self.forward, "backward": self.backward, "combined": self.combined}[phase]

    def forward(self):
        raise NotImplementedError

    def backward(self):
        raise NotImplementedError

    def combined(self):
        raise NotImplementedError

    def outputs(self) -> dict:
        """BSHD tensors of the first calls: out (and dq, dk, dv when a backward ran)."""
        return {}

    def _first_backward_calls(self) -> None:
        """First calls of the PyTorch peers' combined and backward phases, each timed on its own (in that order:
        the first forward+backward compiles or initialises the backward, so that cost lands in `combined`), and
        the forward graph (``_graph_out``) the backward phase differentiates again and again."""
        self.first_call_ms["combined"] = self.timer.first_call(self.combined)
        self._graph_out = self._call()
        self.first_call_ms["backward"] = self.timer.first_call(self.backward)

    def unsupported(self, phase: str) -> Optional[str]:
        """Why this phase cannot be timed after prepare() (None: it can)."""
        return None

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------
# flashspan
# ---------------------------------------------------------------------------


class FlashspanRunner(Runner):
    """flashspan through FlexAttentionFwd/Bwd: plan once, compile once, execute into
    preallocated outputs and workspaces (no allocation inside the timed loop)."""

    name = "flashspan"

    def prepare(self, phases) -> None:
        import flashspan

        i, wl = self.inp, self.wl
        mf = wl.mask_func
        reps = self.timer.reps  # the config's reps, as every timed row
        # Plan build, forward only and with backward (the CUDA planner syncs once itself).
        self.prep_timings["plan_fwd"] = self.timer.measure_host(
            lambda: flashspan.create_mask_plan(mf, i.q, i.k, i.v, build_backward=False), reps)
        holder = {}

        def build_bwd():
            holder["plan"] = flashspan.create_mask_plan(mf, i.q, i.k, i.v, build_backward=True)

        self.prep_timings["plan_fwd_bwd"] = self.timer.measure_host(build_bwd, reps)
        self.plan = plan = holder["plan"]
        self.plan_info = {key: plan.info()[key] for key in (
            "fwd_block_q", "fwd_block_k", "fwd_partial_blocks", "fwd_full_blocks",
            "bwd_partial_blocks", "bwd_full_blocks", "bytes", "num_tasks", "arch")}
        nan = float("nan")
        self.out = torch.full(plan.out_shape(), nan, dtype=i.q.dtype, device=i.q.device)
        self.lse = torch.full(plan.lse_shape(), nan, dtype=torch.float32, device=i.q.device)
        self.dq = torch.full_like(i.q, nan)
        self.dk = torch.full_like(i.k, nan)
        self.dv = torch.full_like(i.v, nan)
        self.fwd = flashspan.FlexAttentionFwd(i.q, i.k, i.v, self.out, plan, self.lse)
        self.fwd.check_support()
        self.fwd.compile()
        self.fwd_ws = torch.empty(self.fwd.workspace_size, dtype=torch.uint8, device=i.q.device)
        self.first_call_ms["forward"] = self.timer.first_call(self.forward)
        self.ran_backward = False
        if any(p in phases for p in ("backward", "combined")):
            self.bwd = flashspan.FlexAttentionBwd(i.q, i.k, i.v, self.out, i.do, self.lse,
                                                  self.dq, self.dk, self.dv, plan)
            self.bwd.check_support()
            self.bwd.compile()
            self.bwd_ws = torch.empty(self.bwd.workspace_size, dtype=torch.uint8, device=i.q.device)
            self.first_call_ms["backward"] = self.timer.first_call(self.backward)
            self.first_call_ms["combined"] = self.timer.first_call(self.combined)
            self.ran_backward = True

    def forward(self):
        i = self.inp
        self.fwd.execute(i.q, i.k, i.v, self.out, self.plan, self.lse, workspace=self.fwd_ws)

    def backward(self):
        i = self.inp
        self.bwd.execute(i.q, i.k, i.v, self.out, i.do, self.lse, self.dq, self.dk, self.dv, self.plan,
                         workspace=self.bwd_ws)

    def combined(self):
        self.forward()
        self.backward()

    def rerun(self) -> None:
        """Poisons the outputs with NaN and runs the prepared phases once more (forward, and the backward when
        prepared), so that outputs() are this call's: the spot check of a switch value (``--switch``)."""
        for t in (self.out, self.lse, self.dq, self.dk, self.dv):
            t.fill_(float("nan"))
        self.forward()
        if self.ran_backward:
            self.backward()
        self.timer.sync()

    def outputs(self) -> dict:
        res = {"out": self.out, "lse": self.lse}
        if self.ran_backward:
            res.update(dq=self.dq, dk=self.dk, dv=self.dv)
        return res

    def api_outputs(self) -> dict:
        """The same problem through the allocating autograd API (flex_attn_func), to check
        that it agrees with the explicit objects that are timed."""
        import flashspan

        i = self.inp
        need_grad = self.ran_backward
        q, k, v = (t.detach().clone().requires_grad_(need_grad) for t in (i.q, i.k, i.v))
        with torch.set_grad_enabled(need_grad):
            out, lse = flashspan.flex_attn_func(q, k, v, mask_plan=self.plan, return_lse=True)
        res = {"out": out.detach(), "lse": lse.detach()}
        if need_grad:
            out.backward(i.do)
            res.update(dq=q.grad, dk=k.grad, dv=v.grad)
        return res

    def close(self) -> None:
        for name in ("fwd", "bwd", "plan"):
            if hasattr(self, name):
                delattr(self, name)


# ---------------------------------------------------------------------------
# PyTorch FlexAttention
# ---------------------------------------------------------------------------

_compiled_flex = None
_compiled_cbm = None


def _compiled_create_block_mask():
    """torch.compile(create_block_mask), the form PyTorch recommends for long sequences
    (the eager one materialises the whole S x S mask); None if it cannot be built."""
    global _compiled_cbm
    if _compiled_cbm is None:
        try:
            from torch.nn.attention.flex_attention import create_block_mask

            _flex()  # raises the recompile limits first
            _compiled_cbm = torch.compile(create_block_mask)
        except Exception:
            _compiled_cbm = False
    return _compiled_cbm or None


def _flex():
    """torch.compile'd flex_attention, shared by all workloads (one compile cache)."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        import torch._dynamo.config as dcfg

        # Every mask_mod is a new specialisation; the default recompile limit (8) would
        # silently fall back to the slow eager path after a few masks.
        for knob in ("cache_size_limit", "recompile_limit"):
            if hasattr(dcfg, knob):
                setattr(dcfg, knob, max(getattr(dcfg, knob), 512))
        for knob in ("accumulated_cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(dcfg, knob):
                setattr(dcfg, knob, max(getattr(dcfg, knob), 4096))
        # The backward is timed by replaying autograd.grad(..., retain_graph=True) on one
        # forward graph; compiled backward graphs with donated buffers refuse that.
        try:
            import torch._functorch.config as fcfg

            fcfg.donated_buffer = False
        except (ImportError, AttributeError):
            pass
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def endpoint_mask_mod(mask_func: torch.Tensor, seqlen: int) -> Callable:
    """A FlexAttention mask_mod that reads flashspan's endpoints: key kv is visible for
    row q of sample b iff kv < F0 or F(2i-1) <= kv < F(2i) for some i."""
    ep = mask_func.to(torch.int32).contiguous()
    per_head = ep.shape[0] > 1
    n = ep.shape[1]

    def mask_mod(b, h, q_idx, kv_idx):
        row = b * seqlen + q_idx
        hh = h if per_head else 0
        vis = kv_idx < ep[hh, 0, row]
        for j in range(1, n, 2):
            vis = vis | ((kv_idx >= ep[hh, j, row]) & (kv_idx < ep[hh, j + 1, row]))
        return vis

    return mask_mod


class FlexRunner(Runner):
    """torch.nn.attention.flex_attention compiled with torch.compile, on a BlockMask from
    create_block_mask (timed too). ``variant``: "endpoints" (a mask_mod reading the same
    endpoints flashspan gets) or "natural" (the mask_mod a PyTorch user would write)."""

    def __init__(self, wl, inputs, timer, variant: str):
        super().__init__(wl, inputs, timer)
        self.variant = variant
        self.name = f"flex_{variant}"

    def prepare(self, phases) -> None:
        try:
            from torch.nn.attention.flex_attention import create_block_mask
        except ImportError as e:
            raise Unavailable(f"torch.nn.attention.flex_attention not importable: {e}") from e
        wl = self.wl
        if self.variant == "natural":
            if wl.natural_mask_mod is None:
                raise Unavailable("no natural mask_mod for this mask")
            mod = wl.natural_mask_mod
            per_sample = False
        else:
            mod = endpoint_mask_mod(wl.mask_func, wl.seqlen)
            per_sample = wl.batch > 1
        per_head = wl.mask_func.shape[0] > 1 and self.variant == "endpoints"
        b_arg = wl.batch if per_sample else None
        h_arg = wl.heads_q if per_head else None
        dev = self.inp.q.device
        compiled = _compiled_create_block_mask()
        state = {"fn": compiled or create_block_mask}

        def build():
            self.block_mask = state["fn"](mod, b_arg, h_arg, wl.seqlen, wl.seqlen, device=dev)

        try:
            self.prep_timings["block_mask"] = self.timer.measure_host(build, self.timer.reps)
        except Exception as e:
            if state["fn"] is create_block_mask:
                raise
            # The compiled builder failed: fall back to the eager one (and say so).
            self.block_mask_note = (f"torch.compile(create_block_mask) failed ({type(e).__name__}: "
                                    f"{str(e)[:200]}); eager used")
            state["fn"] = create_block_mask
            self.prep_timings["block_mask"] = self.timer.measure_host(build, self.timer.reps)
        # FlexAttention has no CPU backward: on CPU (only when asked for) it is timed forward only.
        self.forward_only = not self.timer.cuda
        self.q, self.k, self.v, self.do = self.inp.bhsd(requires_grad=not self.forward_only)
        self.gqa = wl.heads_q != wl.heads_kv
        flex = _flex()
        self._call = lambda: flex(self.q, self.k, self.v, block_mask=self.block_mask, scale=self.inp.scale,
                                  enable_gqa=self.gqa)
        # With a backward to time, the forward is timed as training runs it (grad mode: it
        # also saves LSE, as flashspan's forward writes it) and reuses that compiled graph;
        # a forward-only run times the no-grad (inference) graph.
        self.train_forward = not self.forward_only and any(p in phases for p in ("backward", "combined"))
        self.first_call_ms["forward"] = self.timer.first_call(self.forward)
        self.out_first = self.forward().detach()
        self._grads = None
        if self.train_forward:
            self._first_backward_calls()
            self._grads = torch.autograd.grad(self._graph_out, (self.q, self.k, self.v), self.do, retain_graph=True)

    def unsupported(self, phase: str) -> Optional[str]:
        if phase != "forward" and self.forward_only:
            return "PyTorch FlexAttention has no CPU backward"
        return None

    def forward(self):
        if self.train_forward:
            return self._call()
        with torch.no_grad():
            return self._call()

    def backward(self):
        return torch.autograd.grad(self._graph_out, (self.q, self.k, self.v), self.do, retain_graph=True)

    def combined(self):
        out = self._call()
        return torch.autograd.grad(out, (self.q, self.k, self.v), self.do)

    def outputs(self) -> dict:
        res = {"out": self.out_first.transpose(1, 2)}
        if self._grads is not None:
            res.update(dq=self._grads[0].transpose(1, 2), dk=self._grads[1].transpose(1, 2),
                       dv=self._grads[2].transpose(1, 2))
        return res

    def close(self) -> None:
        for name in ("block_mask", "_graph_out", "_grads", "q", "k", "v", "do", "out_first", "_call"):
            if hasattr(self, name):
                delattr(self, name)


# ---------------------------------------------------------------------------
# PyTorch SDPA
# ---------------------------------------------------------------------------

_SDPA_BACKENDS = {
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_math": "MATH",
    "sdpa_math_mask": "MATH",
}

#: Longest S for which the sdpa_math_mask peer builds its dense [B, Hmask, S, S] bool mask.
#: The math backend materialises the S x S scores per head anyway; at S = 8192 that is
#: 256 MiB per head in fp32, beyond it the peer measures memory traffic, not attention.
DENSE_MASK_MAX_SEQLEN = 8192


class SdpaRunner(Runner):
    """torch.nn.functional.scaled_dot_product_attention pinned to one backend with
    torch.nn.attention.sdpa_kernel (cuDNN, FlashAttention-2, or math).

    ``sdpa_cudnn`` / ``sdpa_flash`` / ``sdpa_math`` express the mask with ``is_causal``
    and so run only dense and causal masks. ``sdpa_math_mask`` runs the math backend
    with a dense boolean ``attn_mask`` built from the endpoints (:func:`flashspan.masks.to_dense`,
    timed as the ``dense_mask`` preparation), so it runs EVERY mask, for
    ``S <= DENSE_MASK_MAX_SEQLEN``.
    """

    def __init__(self, wl, inputs, timer, backend: str):
        super().__init__(wl, inputs, timer)
        self.name = backend
        self.backend_name = _SDPA_BACKENDS[backend]
        self.dense_mask = backend == "sdpa_math_mask"

    def context(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, self.backend_name))

    def _build_dense_mask(self) -> torch.Tensor:
        """bool [B, Hmask, S, S] (True = visible) from the workload's endpoints."""
        from .. import masks as fm

        wl = self.wl
        dense = fm.to_dense(wl.mask_func, wl.seqlen, wl.seqlen)  # [Hmask, B, S, S]
        return dense.permute(1, 0, 2, 3).contiguous()

    def prepare(self, phases) -> None:
        wl = self.wl
        if self.dense_mask:
            if wl.seqlen > DENSE_MASK_MAX_SEQLEN:
                gib = wl.batch * wl.mask_func.shape[0] * wl.seqlen**2 / 2**30
                raise Unavailable(
                    f"dense S x S bool mask only for S <= {DENSE_MASK_MAX_SEQLEN} (S={wl.seqlen}: the mask alone is "
                    f"{gib:.3g} GiB and the math backend materialises S^2 scores per head)")
        elif wl.sdpa_causal is None:
            raise Unavailable("mask not expressible in SDPA with is_causal (only dense and causal are); "
                              "sdpa_math_mask runs it with a dense bool attn_mask")
        if self.backend_name != "MATH" and not self.timer.cuda:
            raise Unavailable(f"{self.backend_name} needs CUDA")
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
        except ImportError as e:
            raise Unavailable(f"torch.nn.attention.sdpa_kernel not importable: {e}") from e
        import torch.nn.functional as F

        self.q, self.k, self.v, self.do = self.inp.bhsd(requires_grad=True)
        if self.dense_mask:
            holder = {}

            def build():
                holder["mask"] = self._build_dense_mask()

            self.prep_timings["dense_mask"] = self.timer.measure_host(build, self.timer.reps)
            self.attn_mask = holder["mask"]
            kwargs = {"attn_mask": self.attn_mask, "scale": self.inp.scale}
        else:
            kwargs = {"is_causal": bool(self.wl.sdpa_causal), "scale": self.inp.scale}
        if self.wl.heads_q != self.wl.heads_kv:
            kwargs["enable_gqa"] = True
        self._call = lambda: F.scaled_dot_product_attention(self.q, self.k, self.v, **kwargs)
        # As for FlexAttention: the forward runs in grad mode (saving LSE, like flashspan's)
        # when a backward is timed too, else in no-grad mode.
        self.train_forward = any(p in phases for p in ("backward", "combined"))
        try:
            with self.context():
                self.first_call_ms["forward"] = self.timer.first_call(self.forward)
                self.out_first = self.forward().detach()
                self._grads = None
                if self.train_forward:
                    self._first_backward_calls()
                    self._grads = torch.autograd.grad(self._graph_out, (self.q, self.k, self.v), self.do,
                                                      retain_graph=True)
        except RuntimeError as e:
            msg = str(e).strip().splitlines()
            raise Unavailable(f"{self.backend_name}: {' '.join(msg[:3])[:300]}") from e

    def forward(self):
        if self.train_forward:
            return self._call()
        with torch.no_grad():
            return self._call()

    def backward(self):
        return torch.autograd.grad(self._graph_out, (self.q, self.k, self.v), self.do, retain_graph=True)

    def combined(self):
        out = self._call()
        return torch.autograd.grad(out, (self.q, self.k, self.v), self.do)

    def outputs(self) -> dict:
        res = {"out": self.out_first.transpose(1, 2)}
        if self._grads is not None:
            res.update(dq=self._grads[0].transpose(1, 2), dk=self._grads[1].transpose(1, 2),
                       dv=self._grads[2].transpose(1, 2))
        return res

    def close(self) -> None:
        for name in ("_graph_out", "_grads", "q", "k", "v", "do", "out_first", "_call", "attn_mask"):
            if hasattr(self, name):
                delattr(self, name)


PEERS = ("flex_endpoints", "flex_natural", "sdpa_cudnn", "sdpa_flash", "sdpa_math", "sdpa_math_mask")


def make_peer(name: str, wl: Workload, inputs: Inputs, timer: Timer) -> Runner:
    if name.startswith("flex_"):
        return FlexRunner(wl, inputs, timer, name[len("flex_"):])
    if name in _SDPA_BACKENDS:
        return SdpaRunner(wl, inputs, timer, name)
    raise ValueError(f"unknown peer {name!r}; expected one of {', '.join(PEERS)}")


def time_phase(runner: Runner, phase: str, timer: Timer) -> Timing:
    with runner.context():
        return timer.measure(runner.fn(phase), runner.first_call_ms.get(phase))
