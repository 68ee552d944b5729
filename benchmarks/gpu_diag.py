"""GPU diagnostics for the fused Triton backward (CUDA only; run through benchmarks/gpu_lease.sh diag,
parts chosen with DIAG_PARTS=1,2,3,4). Kept because each part answered a question once and
answers it again after a kernel change:

1. the fp16 row-wise AdaGrad parity case that exposed the missing barrier (a moving error), one
   step, three fresh runs: rows of each table where triton departs from the reference;
2. modelA-tw128 (embedding_gpu), triton vs the reference backend on CUDA after one step: rows
   that differ, with their contribution counts (the hot rows, before the fix);
3. invariants of plan_segments and the update work list on that batch (runs, table ranges, each
   unique row in exactly one program), then the step with no hot rows;
4. torch.profiler breakdown of the backward + optimizer, uniform and power-law ids.
"""
import sys, zlib
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
import test_gpu as tg  # noqa: E402
import embedding_gpu as eg  # noqa: E402
from neo_train.kernels import SparseOptimizerSpec, TableSpec  # noqa: E402
from neo_train.kernels.reference import ReferenceEmbeddingBag  # noqa: E402
from neo_train.kernels.triton_backend import TritonEmbeddingBag  # noqa: E402


def compare(tri, ref, values, offsets, ftm, tables, label, tol):
    keyed = []
    F = len(ftm)
    B = (offsets.numel() - 1) // F
    lengths = (offsets[1:] - offsets[:-1]).cpu()
    feat = torch.arange(F).repeat_interleave(lengths.view(F, B).sum(1))
    for t in range(len(tables)):
        a, b = tri.get_table(t).float().cpu(), ref.get_table(t).float().cpu()
        diff = (a - b).abs().max(1).values
        bad = torch.nonzero(diff > tol).squeeze(1)
        ids = values.cpu()[torch.isin(feat, torch.tensor([f for f, tt in enumerate(ftm) if tt == t]))]
        cnt = torch.bincount(ids, minlength=tables[t].rows)
        sa, sb = tri.get_state(t), ref.get_state(t)
        sd = max(((sa[k].float().cpu() - sb[k].float().cpu()).abs().max().item() for k in sa), default=0.0)
        print(f"{label} table {t} rows={tables[t].rows} D={tables[t].dim}: bad rows {bad.numel()} "
              f"(max diff {diff.max().item():.3g}, state max diff {sd:.3g}); touched {int((cnt > 0).sum())}, "
              f"hot(>64) {int((cnt > 64).sum())}, max count {int(cnt.max())}")
        for r in bad[:6].tolist():
            cols = torch.nonzero((a[r] - b[r]).abs() > tol).squeeze(1)
            print(f"    row {r}: count {int(cnt[r])}, diff {diff[r].item():.3g}, bad cols {cols.numel()} "
                  f"[{cols.min().item() if cols.numel() else -1}..{cols.max().item() if cols.numel() else -1}]"
                  f" tri {a[r, cols[:3]].tolist()} ref {b[r, cols[:3]].tolist()}")


def part1():
    name = "test_triton_matches_reference[rowwise_adagrad-fp16-plain]"
    seed = zlib.crc32(name.encode())
    tables, ftm = list(tg.GPU_TABLES), list(tg.GPU_FTM)
    opt = SparseOptimizerSpec("rowwise_adagrad", lr=0.05)
    for run in range(3):
        tri = TritonEmbeddingBag(tables, opt, feature_table_map=ftm, device="cuda", weight_dtype=torch.float16, seed=seed)
        ref = ReferenceEmbeddingBag(tables, opt, feature_table_map=ftm, device="cpu", weight_dtype=torch.float16, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        values, offsets, psw = tg.parity_batch(gen, tables, ftm, tg.GPU_B, tg.GPU_MAX_L, "random", False)
        grad = torch.randn(tg.GPU_B, tri.total_dim, generator=gen)
        (tri(values.cuda(), offsets.cuda()) * grad.cuda()).sum().backward()
        (ref(values, offsets) * grad).sum().backward()
        torch.cuda.synchronize()
        compare(tri, ref, values, offsets, ftm, tables, f"[fp16 run {run}]", 2e-3)


def part2():
    w = [x for x in eg.make_workloads(["modelA-tw128"], None)][0]
    b = eg.make_batch(w, 0, 1.1, torch.device("cuda"))
    tables = [TableSpec(w.rows, d) for d in w.dims]
    opt = SparseOptimizerSpec("rowwise_adagrad", lr=0.01)
    tri = TritonEmbeddingBag(tables, opt, device="cuda", seed=0)
    ref = ReferenceEmbeddingBag(tables, opt, device="cuda", seed=0)
    for m in (tri, ref):
        m.check_ids = False
        m(b.values, b.offsets).backward(b.grad_out)
    torch.cuda.synchronize()
    compare(tri, ref, b.values, b.offsets, list(range(len(tables))), tables, "[modelA-tw128 fp32]", 1e-4)


def part3():
    """Invariants of the segments and the update work list on the modelA batch; then the step
    without hot rows (threshold above every count)."""
    from neo_train.kernels.triton_backend import _kernels
    _, bwd = _kernels()
    w = eg.make_workloads(["modelA-tw128"], None)[0]
    b = eg.make_batch(w, 0, 1.1, torch.device("cuda"))
    tables = [TableSpec(w.rows, d) for d in w.dims]
    opt = SparseOptimizerSpec("rowwise_adagrad", lr=0.01)
    m = TritonEmbeddingBag(tables, opt, device="cuda", seed=0)
    B = w.batch
    s = bwd.plan_segments(b.values, b.offsets.to(torch.int64), None, B, m._feat_row_base, m._tab_row_base,
                          m._tab_dim, m._row_base[-1], m.hot_row_threshold, m.hot_row_chunk)
    uniq = s.uniq.long().cpu()
    print("uniq strictly increasing:", bool((uniq[1:] > uniq[:-1]).all()), "U", uniq.numel(),
          "seg ok:", int(s.seg[-1]) == b.values.numel())
    tab, u0, n_tiles = bwd.update_work_list(s, m._tab_meta, m._tab_class)
    tab, u0 = tab.long().cpu(), u0.long().cpu()
    tab_u = s.tab_u.cpu()
    cover = torch.zeros(uniq.numel(), dtype=torch.int64)
    for i in range(n_tiles):
        t = int(tab[i]); rows = bwd.rows_per_program(m._tab_class[t])
        a, e = int(u0[i]), min(int(u0[i]) + rows, int(tab_u[t + 1]))
        cover[a:e] += 1
    hot = s.hot_rows.cpu() if s.hot_rows is not None else torch.zeros(0, dtype=torch.int64)
    print("tiles", n_tiles, "hot programs", tab.numel() - n_tiles, "hot unique:", hot.unique().numel() == hot.numel(),
          "hot u0 == hot rows:", torch.equal(u0[n_tiles:], hot))
    print("tile coverage counts:", torch.bincount(cover).tolist(), "| hot rows covered by tiles:",
          int((cover[hot] != 1).sum()) if hot.numel() else 0, "/", hot.numel())
    pi = s.part_index.cpu()
    pc = pi[1:] - pi[:-1]
    print("rows with partials:", int((pc > 0).sum()), "== hot", hot.numel(), "| hot tab ok:",
          torch.equal(s.hot_tab.cpu(), torch.searchsorted(tab_u, hot, right=True) - 1))
    for thr in (10**9,):
        tri = TritonEmbeddingBag(tables, opt, device="cuda", seed=0, hot_row_threshold=thr)
        ref = ReferenceEmbeddingBag(tables, opt, device="cuda", seed=0)
        for mm in (tri, ref):
            mm.check_ids = False
            mm(b.values, b.offsets).backward(b.grad_out)
        torch.cuda.synchronize()
        compare(tri, ref, b.values, b.offsets, list(range(len(tables))), tables, f"[no hot rows thr={thr}]", 1e-4)


def part4():
    """Where the fused backward's time goes (modelA-tw128, uniform and power-law ids)."""
    from torch.profiler import ProfilerActivity, profile
    w = eg.make_workloads(["modelA-tw128"], None)[0]
    tables = [TableSpec(w.rows, d) for d in w.dims]
    for alpha in (0.0, 1.1):
        b = eg.make_batch(w, 0, alpha, torch.device("cuda"))
        m = TritonEmbeddingBag(tables, SparseOptimizerSpec("rowwise_adagrad", lr=0.01), device="cuda", seed=0)
        m.check_ids = False
        for _ in range(3):
            m(b.values, b.offsets).backward(b.grad_out)
        torch.cuda.synchronize()
        outs = [m(b.values, b.offsets) for _ in range(5)]
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for o in outs:
                o.backward(b.grad_out)
            torch.cuda.synchronize()
        print(f"== alpha {alpha}: 5 backward+optimizer calls")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))


if __name__ == "__main__":
    import os
    for part in os.environ.get("DIAG_PARTS", "1,2,3").split(","):
        globals()[f"part{part}"]()
