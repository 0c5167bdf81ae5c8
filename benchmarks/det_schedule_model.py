"""MODEL, NOT A MEASUREMENT: the deterministic sm90 backward's schedule on the eight benchmark masks.

Nothing here runs on a GPU. The model asks one question of a work list: how long do 132 persistent
CTAs take to run it, counting load imbalance and the deterministic dQ turns, but not memory traffic
(L2 reuse, DRAM) or the split items' zero / convert kernels. It compares the orders the
deterministic backward could take with the non-deterministic one's, so that a schedule is chosen
for a reason before it is written (issue 22: det / non-det 0.58-0.81x on sink_local, the trees and
longformer, PERF_LOG v2.50).

What is modelled (each a rule of the kernels, mirrored here; the C sources are the rules):
  * the walks: the K2Q lists of 64 x 128 tiles (query block 64 rows, key block 128 keys), computed
    from the endpoints of flashspan.masks.benchmark_mask; a step is partial or full;
  * the cuts: split_rule.h split_chunk (the per-grid rule of the non-deterministic list) and
    split_cut_plan_only_first / split_cut_plan_only (the deterministic one, cut above m x the mean);
    a cut task's items are split_schedule.cuh's near-equal step ranges, consecutive in the list;
  * the lists: non-deterministic -- the view's task list (longest first) or, when a head's query
    side outgrows L2 (tile_sm90.h bwd_cell_order_sm90), cells ascending, heads slowest;
    deterministic -- cells descending (heads fastest: TileScheduler::cell_descending), taken in snake
    waves (next_cell_item) or claimed in list order (claim); plus candidate orders (below);
  * a CTA runs an item's steps back to back (cost 1 a full step, 1 + PARTIAL a partial one, plus
    ITEM a work item: K / V load and the dK / dV epilogue); its dQ writer adds step j's tile after
    the consumers finished it and, deterministic, after the tile's previous addition in the order
    (+ TURN, the counter's hand-off), taking WRITE; the consumers' dQ tile in shared memory is
    single-buffered, so step j + 1's dQ waits for the writer to have read step j's tile.
Claimed lists go to whichever CTA frees first, in list order (so every dependency of an item lies
on an earlier item, which this model has already timed); snake waves are static.

Candidate orders (deterministic: each dQ tile sums its contributions in a fixed order; a claimed
list is deadlock-free for any order in which every contribution precedes the later list items'
ones, kernel_bwd_sm90.cuh's argument):
  desc      cells descending, dQ order descending key blocks (what runs today);
  lpt       cells longest first (ties: descending key block), dQ order = list order;
  asc       cells ascending, dQ order ascending key blocks;
  desc-hs   cells descending per head, heads slowest (each head's cells in turn; dQ order descending
            key blocks, as desc: a tile's contributors are one head's; BwdParams::det_band = kDetBandAll);
  bandB     key blocks descending in bands of B, each band's cells head by head (BwdParams::det_band = B);
  hybridB   as bandB over the blocks without a cut cell, each block with one alone and heads fastest (not built);
  tailB     bandB over the blocks above the highest block with a cut cell, then the blocks from it down heads
            fastest (not built; needs only that block's index from the scan, no permutation);
  desc-h2   pairs of heads slowest, each pair's heads fastest;
  cutlast   uncut cells (desc) first, then the cut cells' items, whose additions come last in each tile
            (cutlast-hs: both parts heads slowest; cutlast-hs2: the cut part only);
  nondet    the non-deterministic list (no turns), the reference of the ratios;
  a "-U" suffix (desc-U, desc-hs-U, desc-h2-U): the same list without the dQ turns.

Usage: python benchmarks/det_schedule_model.py [--seqlen 32768] [--masks ...] [--heads 4]
Output: per mask the modelled time of each schedule in units of one full step, and its efficiency
(total work / (CTAs x time)); "det/nondet" is the ratio a benchmark would show if the model held.
"""

from __future__ import annotations

import argparse
import heapq
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

BQ, BK = 64, 128  # the sm90 backward's tile up to D = 128 (tile_sm90.h)
CTAS = 132        # an H100 / H200
K_CHUNK_MIN, K_ITEMS_PER_CTA, K_MAX_SPLIT = 16, 4, 1024  # params.h SplitSchedule
PLAN_ONLY_CTAS, PLAN_ONLY_ITEMS_PER_CTA = 132, 16        # split_rule.h


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // max(b, 1)


def walks(mask: str, s: int) -> list[list[tuple[int, bool]]]:
    """K2Q walk of every key block: ascending (query block, full) pairs of a one-head plan."""
    import flashspan.masks as fm

    ep = fm.benchmark_mask(mask, s)[0].numpy().astype(np.int64)  # [nfunc, S]
    nqb, nkb = ceil_div(s, BQ), ceil_div(s, BK)
    out: list[list[tuple[int, bool]]] = [[] for _ in range(nkb)]
    for qb in range(nqb):
        rows = ep[:, qb * BQ:(qb + 1) * BQ]
        diff = np.zeros((rows.shape[1], s + 1), np.int32)
        r = np.arange(rows.shape[1])
        np.add.at(diff, (r, np.zeros_like(r)), 1)  # [0, F0)
        np.add.at(diff, (r, rows[0]), -1)
        for f in range(1, rows.shape[0] - 1, 2):
            a, e = rows[f], rows[f + 1]
            ok = e > a
            np.add.at(diff, (r[ok], a[ok]), 1)
            np.add.at(diff, (r[ok], e[ok]), -1)
        dense = np.cumsum(diff[:, :s], axis=1) > 0
        pad = nkb * BK - s
        if pad:
            dense = np.pad(dense, ((0, 0), (0, pad)))
        per_kb = dense.reshape(dense.shape[0], nkb, BK).sum(axis=(0, 2))
        for kb in np.nonzero(per_kb)[0]:
            out[kb].append((qb, bool(per_kb[kb] == BQ * BK)))
    return out


def split_chunk(total: int, num_tasks: int, ctas: int) -> int:
    """split_rule.h split_chunk (the per-grid rule)."""
    chunk = max(K_CHUNK_MIN, ceil_div(total, K_ITEMS_PER_CTA * ctas), ceil_div(total, K_MAX_SPLIT))
    if num_tasks >= ctas:
        chunk = max(chunk, ceil_div(2 * total, num_tasks))
    elif 2 * num_tasks <= ctas:
        chunk = max(chunk, ceil_div(total, ctas - num_tasks))
    return chunk


def plan_only_cut(steps: list[int], m: int) -> tuple[int, int]:
    """split_rule.h split_cut_plan_only_first / split_cut_plan_only: (chunk, above)."""
    total, n = sum(steps), len(steps)
    c1 = max(K_CHUNK_MIN, ceil_div(total, PLAN_ONLY_ITEMS_PER_CTA * PLAN_ONLY_CTAS))
    above = max(c1, ceil_div(m * total, n))
    first = sum(ceil_div(x, c1) for x in steps if x > above)
    if first < K_MAX_SPLIT:
        return c1, above
    c2 = max(c1, ceil_div(2 * total, K_MAX_SPLIT))
    return c2, max(c2, ceil_div(m * total, n))


def items_of(cells: list[tuple[int, int]], steps: dict, chunk: int, above: int) -> list[tuple[int, int, int, int]]:
    """(kb, head, begin, end) items of the cells in list order, cut tasks into near-equal ranges."""
    out = []
    for kb, h in cells:
        n = steps[kb]
        if n == 0:
            continue
        k = ceil_div(n, chunk) if n > above else 1
        for i in range(k):
            out.append((kb, h, i * n // k, (i + 1) * n // k))
    return out


class Costs:
    def __init__(self, partial: float, item: float, turn: float, write: float, buffers: int = 1):
        self.partial, self.item, self.turn, self.write, self.buffers = partial, item, turn, write, buffers


def simulate(items, walk, heads, costs: Costs, *, order=None, snake=False, log=None) -> float:
    """Time (full-step units) of 132 CTAs running `items`; order(kb, h) -> rank key of the dQ order
    (smaller adds first) or None for no turns. Returns the makespan."""
    done: dict[tuple[int, int, int], float] = {}  # (head, qb, kb) -> time its addition completed
    contrib: dict[tuple[int, int], list] = {}
    if order is not None:
        # Each tile's contributors sorted by the order: the predecessor of (h, qb, kb).
        for kb, w in enumerate(walk):
            for qb, _ in w:
                for h in range(heads):
                    contrib.setdefault((h, qb), []).append(kb)
        pred = {}
        for (h, qb), kbs in contrib.items():
            kbs.sort(key=lambda kb: order(kb, h))
            for a, b in zip(kbs, kbs[1:]):
                pred[(h, qb, b)] = a
    free = [(0.0, c) for c in range(CTAS)]
    heapq.heapify(free)
    cta_time = [0.0] * CTAS
    end = 0.0
    for i, (kb, h, b0, b1) in enumerate(items):
        if snake:
            wave, lane = divmod(i, CTAS)
            c = lane if wave % 2 == 0 else CTAS - 1 - lane
            t = cta_time[c]
        else:
            t, c = heapq.heappop(free)
        t += costs.item
        reads = [-1e30] * costs.buffers  # when the writer has read the tiles of the last `buffers` steps
        wdone = t
        for qb, full in walk[kb][b0:b1]:
            t = max(t + (1.0 if full else 1.0 + costs.partial), reads[0])
            start = max(t, wdone)
            if order is not None:
                p = pred.get((h, qb, kb))
                if p is not None:
                    start = max(start, done[(h, qb, p)] + costs.turn)
            reads = reads[1:] + [start + costs.write]
            wdone = start + costs.write
            if log is not None:
                log.append((t, h, qb))
            done[(h, qb, kb)] = wdone
        t = max(t, wdone)
        end = max(end, t)
        if snake:
            cta_time[c] = t
        else:
            heapq.heappush(free, (t, c))
    return end


def l2_misses(log: list, tiles: int) -> int:
    """Misses of an LRU cache of `tiles` query-side tiles (Q, dO, the dQ tile: 64 KB a (head, query
    block) at D = 128) over the steps' accesses in time order: a proxy of the DRAM traffic."""
    from collections import OrderedDict

    cache: OrderedDict = OrderedDict()
    misses = 0
    for _, h, qb in sorted(log):
        key = (h, qb)
        if key in cache:
            cache.move_to_end(key)
            continue
        misses += 1
        cache[key] = True
        if len(cache) > tiles:
            cache.popitem(last=False)
    return misses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqlen", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--masks", default="causal,document_causal,local,sink_local,tree_dfs,tree_bfs,longformer,hstu")
    ap.add_argument("--above-mean", type=int, default=4, help="the deterministic cut's m (bwd_det_split_above_mean)")
    ap.add_argument("--partial", type=float, default=0.15, help="extra cost of a partial step")
    ap.add_argument("--item", type=float, default=2.0, help="cost of a work item beside its steps")
    ap.add_argument("--turn", type=float, default=0.3, help="latency of a dQ turn's hand-off")
    ap.add_argument("--write", type=float, default=0.15, help="the dQ writer's time per addition")
    ap.add_argument("--dq-buffers", type=int, default=1, help="dQ tiles in shared memory (the consumers' lead)")
    ap.add_argument("--l2-tiles", type=int, default=640, help="query-side tiles (64 KB) the L2 holds")
    ap.add_argument("--schedules", default="nondet,desc,desc-U,desc-hs,lpt,asc")
    ap.add_argument("--dram-tbs", type=float, default=3.35, help="DRAM bandwidth, TB/s (H100 SXM; H200 4.8)")
    ap.add_argument("--step-us", type=float, default=2.2, help="a full step's time on one SM, us (D = 128)")
    a = ap.parse_args()
    costs = Costs(a.partial, a.item, a.turn, a.write, a.dq_buffers)
    s, heads = a.seqlen, a.heads
    names = a.schedules.split(",")
    # A miss's DRAM time in step units, the whole GPU's bandwidth shared: a tile's 64 KB over the DRAM
    # bandwidth, per step of one SM. "with mem" = time + misses x that, as if the misses' traffic did not
    # overlap the steps (the form that reproduced the measured ratios best, PERF_LOG v2.51).
    per_miss = 64 * 1024 / (a.dram_tbs * 1e12) / (a.step_us * 1e-6)
    print(f"S={s} H={heads} tile {BQ}x{BK}, {CTAS} CTAs; time in full steps, misses per step of an LRU L2 of "
          f"{a.l2_tiles} query-side tiles; nondet/x on time, then with the misses' DRAM time added. "
          "MODEL, not a measurement.")
    print(f"{'mask':16s} {'ideal':>6s} " + " ".join(f"{n:>14s}" for n in names) + "  nondet/x: "
          + " ".join(f"{n:>7s}" for n in names[1:]) + " | with mem: " + " ".join(f"{n:>7s}" for n in names[1:]))
    for mask in a.masks.split(","):
        walk = walks(mask, s)
        nkb = len(walk)
        steps = {kb: len(w) for kb, w in enumerate(walk)}
        cost = {kb: sum(1.0 if f else 1.0 + costs.partial for _, f in w) for kb, w in enumerate(walk)}
        cells_all = [steps[kb] for kb in range(nkb) for _ in range(heads)]
        chunk, above = plan_only_cut(cells_all, a.above_mean)
        uneven = max(cells_all) * len(cells_all) > 2 * sum(cells_all)
        desc_cells = [(kb, h) for kb in reversed(range(nkb)) for h in range(heads)]
        lpt_cells = sorted(desc_cells, key=lambda c: (-steps[c[0]], -c[0], c[1]))
        rank = {c: i for i, c in enumerate(lpt_cells)}

        def schedule(name):
            """(items, dQ order or None, snake) of a schedule."""
            if name == "nondet":  # per-grid chunk; the view's task list, or cells ascending heads slowest
                nd_chunk = split_chunk(sum(cells_all), len(cells_all), CTAS)
                if 5 * s * (256 * 2 + 128 * 4) > 3 * 50 * 2**20:  # tile_sm90.h bwd_cell_order_sm90, D = 128
                    cells = [(kb, h) for h in range(heads) for kb in range(nkb)]
                else:
                    cells = sorted(((kb, h) for kb in range(nkb) for h in range(heads)), key=lambda c: -steps[c[0]])
                return items_of(cells, steps, nd_chunk, nd_chunk), None, False
            if name in ("desc", "desc-U"):
                return items_of(desc_cells, steps, chunk, above), (lambda kb, h: -kb) if name == "desc" else None, not uneven
            if name in ("desc-hs", "desc-hs-U"):
                cells = [(kb, h) for h in range(heads) for kb in reversed(range(nkb))]
                return items_of(cells, steps, chunk, above), (lambda kb, h: -kb) if name == "desc-hs" else None, not uneven
            if name.startswith("band"):  # bands of B key blocks descending, heads slowest within a band
                bw = int(name[4:].rstrip("-U"))
                cells = [(kb, h) for top in range(nkb - 1, -1, -bw) for h in range(heads)
                         for kb in range(top, max(top - bw, -1), -1)]
                return items_of(cells, steps, chunk, above), None if name.endswith("-U") else (lambda kb, h: -kb), not uneven
            if name.startswith("hybrid"):  # bands of B uncut blocks head by head; a block with a cut cell alone, heads fastest
                bw = int(name[6:].rstrip("-U"))
                cells, run = [], []
                def flush():
                    cells.extend((kb, h) for h in range(heads) for kb in run)
                    run.clear()
                for kb in reversed(range(nkb)):
                    if steps[kb] > above:
                        flush()
                        cells.extend((kb, h) for h in range(heads))
                    else:
                        run.append(kb)
                        if len(run) == bw:
                            flush()
                flush()
                return items_of(cells, steps, chunk, above), None if name.endswith("-U") else (lambda kb, h: -kb), not uneven
            if name.startswith("tail"):  # bands of B over the blocks above the highest cut block, then the
                # blocks from it down heads fastest (arithmetic: one number T from the scan, no permutation)
                bw = int(name[4:].rstrip("-U"))
                cut_blocks = [kb for kb in range(nkb) if steps[kb] > above]
                t = max(cut_blocks) + 1 if cut_blocks else 0
                cells = [(kb, h) for top in range(nkb - 1, t - 1, -bw) for h in range(heads)
                         for kb in range(top, max(top - bw, t - 1), -1)]
                cells += [(kb, h) for kb in reversed(range(t)) for h in range(heads)]
                return items_of(cells, steps, chunk, above), None if name.endswith("-U") else (lambda kb, h: -kb), not uneven
            if name in ("desc-h2", "desc-h2-U"):  # pairs of heads slowest, each pair's heads fastest
                cells = [(kb, h) for g in range(0, heads, 2) for kb in reversed(range(nkb)) for h in range(g, min(g + 2, heads))]
                return items_of(cells, steps, chunk, above), (lambda kb, h: -kb) if name == "desc-h2" else None, not uneven
            if name.startswith("cutlast"):  # uncut cells, then cut ones; dQ order (cut, descending key block)
                hs_cells = [(kb, h) for h in range(heads) for kb in reversed(range(nkb))]
                cut = lambda c: steps[c[0]] > above
                first = hs_cells if name == "cutlast-hs" else desc_cells
                last = hs_cells if name in ("cutlast-hs", "cutlast-hs2") else desc_cells
                cells = [c for c in first if not cut(c)] + [c for c in last if cut(c)]
                return (items_of(cells, steps, chunk, above), lambda kb, h: (steps[kb] > above, -kb),
                        not uneven)
            if name == "lpt":
                return items_of(lpt_cells, steps, chunk, above), lambda kb, h: rank[(kb, h)], False
            if name == "asc":
                cells = [(kb, h) for kb in range(nkb) for h in range(heads)]
                return items_of(cells, steps, chunk, above), lambda kb, h: kb, False
            raise ValueError(name)

        res = {}
        for n in names:
            items, order, snake = schedule(n)
            log: list = []
            t = simulate(items, walk, heads, costs, order=order, snake=snake, log=log)
            misses = l2_misses(log, a.l2_tiles)
            res[n] = (t, misses / len(log), t + misses * per_miss)
        ideal = heads * sum(cost.values()) / CTAS
        print(f"{mask:16s} {ideal:6.0f} " + " ".join(f"{res[n][0]:8.0f} {res[n][1]:5.2f}" for n in names) + "  "
              + " ".join(f"{res[names[0]][0] / res[n][0]:7.2f}" for n in names[1:]) + " |           "
              + " ".join(f"{res[names[0]][2] / res[n][2]:7.2f}" for n in names[1:]))


if __name__ == "__main__":
    main()
