"""The report's plots, each a function from model parts to one inline <svg> (or an empty-state
note when there is nothing to draw yet).

x axes are ordinal (gate run k, cycle k, HEAD move k) rather than wall-clock time: a store is
followed over weeks with bursts of activity, and equal spacing keeps every event readable;
the time of each event is in its tooltip.
"""

from __future__ import annotations

import math

from ledger.report import svg
from ledger.report.model import Cycle, Generation, HeadMove, Judge, Receipt
from ledger.report.svg import Linear, circle, cls, esc, fmt, line, path, polygon, rect, text

W = 960
LEFT, RIGHT = 64, 24
PALETTE = 8  # loss-curve colour classes c0..c7 in the stylesheet


def empty(message: str) -> str:
    return f'<p class="empty">{esc(message)}</p>'


def _when(t: str) -> str:
    return t[:19].replace("T", " ") if t else ""


def _every(n: int, span_px: float, label_px: float) -> int:
    """Label every k-th of n equally spaced slots so that labels `label_px` wide never overlap."""
    return max(1, math.ceil(n * label_px / max(1.0, span_px)))


def _slot_label(j: Judge, k: int) -> str:
    return f"cycle {j.cycle}" if j.cycle is not None else f"run {k + 1}"


# --- score history with the η band ---------------------------------------------------------
def score_history(judges: tuple[Judge, ...]) -> str:
    """Incumbent (HEAD) and candidate action-span loss at every gate run, with the η band:
    a candidate is accepted only below incumbent − η (and with the other rule-4 conditions)."""
    if not judges:
        return empty("No gate runs yet: `ledger run` (or `ledger judge`) scores a candidate against HEAD.")
    H, top, bottom = 340, 24, 64
    scored = [j for j in judges if j.scored and j.incumbent_loss is not None and j.candidate_loss is not None]
    vals = [v for j in scored for v in (j.incumbent_loss, j.candidate_loss, j.incumbent_loss - (j.eta or 0))]
    ys = Linear(*svg.padded(vals), H - bottom, top)
    xs = Linear(-0.5, len(judges) - 0.5, LEFT, W - RIGHT)
    slot = (W - LEFT - RIGHT) / len(judges)
    half = min(22.0, slot * 0.3)
    out = [
        svg.y_axis(ys, LEFT, W - RIGHT, "nats/token (lower is better)"),
        line(LEFT, H - bottom, W - RIGHT, H - bottom, "axisline"),
    ]
    head_path = []
    label_every = _every(len(judges), W - LEFT - RIGHT, 64)
    for k, j in enumerate(judges):
        x = xs(k)
        if k % label_every == 0:
            out.append(text(x, H - bottom + 16, _slot_label(j, k), "tick", "middle"))
            if slot >= 110:  # room for the verdict's name; otherwise its colour says it
                out.append(text(x, H - bottom + 30, j.verdict, f"tick vt {cls(j.verdict)}", "middle"))
        if not (j.scored and j.incumbent_loss is not None and j.candidate_loss is not None):
            out.append(circle(x, top + 6, 5, f"unscored v {cls(j.verdict)}",
                              f"{_slot_label(j, k)} ({_when(j.time)}): {j.verdict}, decided before scoring"))
            continue
        inc, cand, eta = j.incumbent_loss, j.candidate_loss, j.eta or 0.0
        out.append(rect(x - half, ys(inc), 2 * half, ys(inc - eta) - ys(inc), "band",
                        f"η band: incumbent {fmt(inc)} to incumbent − η = {fmt(inc - eta)} (η {fmt(eta)}); "
                        "a candidate must land below it"))
        out.append(line(x, ys(inc), x, ys(cand), "conn"))
        out.append(line(x - half, ys(inc), x + half, ys(inc), "inc"))
        # HEAD's score as a step path: level through the run, dropping to the candidate on Accept
        head_path += [(x - half, ys(inc)), (x + half, ys(inc))]
        if j.verdict == "Accept":
            head_path.append((x + half, ys(cand)))
        tip = (f"{_slot_label(j, k)} ({_when(j.time)}): {j.verdict}; candidate {fmt(cand)} vs incumbent {fmt(inc)}, "
               f"Δ {fmt(j.mean_delta)}, η {fmt(eta)}, p {fmt(j.p, 3)} ({j.p_side}), wins {j.wins}/{j.n}")
        out.append(circle(x, ys(cand), 6, f"v {cls(j.verdict)}", tip))
    out.insert(2, path(head_path, "headline", "HEAD's score: the incumbent at each gate run, the candidate after an Accept"))
    lx = LEFT + 8
    out.append(f'<g class="legend">{rect(lx, 4, 14, 10, "band")}{text(lx + 20, 13, "η band")}'
               f'{line(lx + 80, 9, lx + 100, 9, "inc")}{text(lx + 106, 13, "incumbent (HEAD)")}'
               f'{circle(lx + 232, 9, 5, "v Accept")}{text(lx + 242, 13, "candidate, by verdict")}</g>')
    return svg.svg(W, H, "".join(out), "score history across gate runs with the eta band", "plot score")


# --- verdict timeline ----------------------------------------------------------------------
def verdict_timeline(cycles: tuple[Cycle, ...], judges: tuple[Judge, ...]) -> str:
    """Every learn cycle's end (Accept → commit, or a refusal with its reason codes), plus gate
    runs outside any cycle (`ledger judge`), in journal order."""
    events = [("cycle", c.seq, c) for c in cycles] + [("judge", j.seq, j) for j in judges if j.cycle is None]
    events.sort(key=lambda e: e[1])
    if not events:
        return empty("No learn cycle has ended yet.")
    slot = (W - RIGHT - LEFT + 30) / len(events)
    dense = slot < 110  # reasons and verdict names need room; tooltips and the table keep them
    max_reasons = 0 if dense else max(len(e[2].reasons) for e in events)
    label_every = _every(len(events), W - RIGHT - LEFT + 30, 64)
    axis_y = 44
    H = axis_y + 44 + 14 * max_reasons + 8
    xs = Linear(-0.5, len(events) - 0.5, LEFT - 30, W - RIGHT)
    out = [line(xs.r0, axis_y, xs.r1, axis_y, "axisline")]
    for k, (what, _, e) in enumerate(events):
        x = xs(k)
        if what == "cycle":
            head = f"cycle {e.cycle}"
            codes = list(e.reasons)
            tip = (f"cycle {e.cycle} ({_when(e.time)}): {e.verdict}"
                   + (f" → gen-{e.generation} committed" if e.outcome == "commit" else
                      f", refused ({', '.join(codes)}); HEAD stayed gen-{e.generation}"))
            shape = circle(x, axis_y, 8, f"v {cls(e.verdict)}", tip)
        else:
            head = "judge"
            codes = [c for c, _ in e.reasons]
            tip = f"gate run ({_when(e.time)}): {e.verdict} ({', '.join(codes)})"
            shape = rect(x - 7, axis_y - 7, 14, 14, f"v {cls(e.verdict)}", tip)
        out.append(shape)
        if k % label_every == 0:
            out.append(text(x, axis_y - 16, head, "tick", "middle"))
            if not dense:
                out.append(text(x, axis_y + 26, e.verdict, f"vt {cls(e.verdict)}", "middle"))
        if not dense:
            for i, code in enumerate(codes):
                out.append(text(x, axis_y + 42 + 14 * i, code, "reason", "middle"))
    return svg.svg(W, H, "".join(out), "verdict timeline", "plot timeline")


# --- loss curves ---------------------------------------------------------------------------
def receipt_label(r: Receipt) -> str:
    where = f"cycle {r.cycle}" if r.cycle is not None else (f"re-run of {r.rerun_of[:11]}" if r.rerun_of else "standalone")
    return f"{where} · {r.trainer} · {r.id[:11]}"


def loss_curves(receipts: tuple[Receipt, ...]) -> str:
    """Per-step training loss of every receipt (one curve per run)."""
    rs = [r for r in receipts if r.losses]
    if not rs:
        return empty("No training receipts with losses yet.")
    legend_rows = min(len(rs), PALETTE)
    H = 320 + 16 * ((legend_rows + 2) // 3)
    plot_bottom = 260
    top = 16
    steps = max(len(r.losses) for r in rs)
    xs = Linear(1, max(2, steps), LEFT, W - RIGHT)
    ys = Linear(*svg.padded([v for r in rs for v in r.losses]), plot_bottom, top)
    out = [svg.y_axis(ys, LEFT, W - RIGHT, "loss"), svg.x_axis(xs, plot_bottom, "optimizer step", integer=True)]
    recent = len(rs) - PALETTE  # the last PALETTE runs in colour; older ones faint, behind them
    for i, r in enumerate(rs):
        pts = [(xs(s + 1), ys(v)) for s, v in enumerate(r.losses)]
        out.append(path(pts, f"curve c{i % PALETTE}" + (" old" if i < recent else ""),
                        f"{receipt_label(r)}: {len(r.losses)} steps, {fmt(r.losses[0])} → {fmt(r.losses[-1])}, rung {r.rung}"))
    shown = rs[-legend_rows:]
    for k, r in enumerate(shown):
        i = rs.index(r)
        x = LEFT + (k % 3) * 300
        y = plot_bottom + 52 + 16 * (k // 3)
        out.append(line(x, y - 4, x + 18, y - 4, f"curve c{i % PALETTE}"))
        out.append(text(x + 24, y, f"{receipt_label(r)}  {fmt(r.losses[0], 3)}→{fmt(r.losses[-1], 3)}", "legend"))
    if len(rs) > legend_rows:
        out.append(
            text(
                W - RIGHT,
                plot_bottom + 36,
                f"in colour: the last {legend_rows} of {len(rs)} runs; older runs grey",
                "tick",
                "end",
            )
        )
    return svg.svg(W, H, "".join(out), "training loss curves per receipt", "plot losses")


# --- canary vs scored deltas ---------------------------------------------------------------
def deltas(judges: tuple[Judge, ...]) -> str:
    """Mean paired delta (candidate − incumbent) on the scored set and on the canaries, per gate
    run. Scored must fall below −η to pass; canaries rising past their threshold while the scored
    set improves is the divergence rule (GamedTheEvaluator)."""
    js = [j for j in judges if j.mean_delta is not None]
    if not js:
        return empty("No scored gate runs yet.")
    H, top, bottom = 300, 24, 48
    vals = [v for j in js for v in (j.mean_delta, j.canary_delta, -(j.eta or 0), j.divergence_threshold) if v is not None]
    ys = Linear(*svg.padded(vals, include_zero=True), H - bottom, top)
    xs = Linear(-0.5, len(js) - 0.5, LEFT, W - RIGHT)
    slot = (W - LEFT - RIGHT) / len(js)
    bw = min(28.0, slot * 0.3)
    out = [svg.y_axis(ys, LEFT, W - RIGHT, "mean Δ nats/token"), line(LEFT, ys(0), W - RIGHT, ys(0), "zero")]
    every = _every(len(js), W - LEFT - RIGHT, 64)
    for k, j in enumerate(js):
        x = xs(k)
        out.append(rect(x - bw, ys(0), bw, ys(j.mean_delta) - ys(0), "bar-s",
                        f"{_slot_label(j, k)}: scored mean Δ {fmt(j.mean_delta)} (η {fmt(j.eta)}), {j.verdict}"))
        if j.eta:
            out.append(line(x - bw - 4, ys(-j.eta), x + 2, ys(-j.eta), "eta"))
        if j.canary_delta is not None:
            out.append(rect(x, ys(0), bw, ys(j.canary_delta) - ys(0), "bar-k",
                            f"{_slot_label(j, k)}: canary mean Δ {fmt(j.canary_delta)} over {j.canary_k} canaries, "
                            f"{j.canary_worse} worse; divergence threshold {fmt(j.divergence_threshold)}"))
            if j.divergence_threshold is not None:
                out.append(line(x - 2, ys(j.divergence_threshold), x + bw + 4, ys(j.divergence_threshold), "div"))
        if k % every == 0:
            out.append(text(x, H - bottom + 16, _slot_label(j, k), "tick", "middle"))
            if slot >= 110:
                out.append(text(x, H - bottom + 30, j.verdict, f"tick vt {cls(j.verdict)}", "middle"))
    lx = LEFT + 8
    out.append(f'<g class="legend">{rect(lx, 4, 12, 10, "bar-s")}{text(lx + 18, 13, "scored mean Δ")}'
               f'{rect(lx + 130, 4, 12, 10, "bar-k")}{text(lx + 148, 13, "canary mean Δ")}'
               f'{line(lx + 262, 9, lx + 282, 9, "eta")}{text(lx + 288, 13, "−η (must get below)")}'
               f'{line(lx + 430, 9, lx + 450, 9, "div")}{text(lx + 456, 13, "canary divergence threshold")}</g>')
    return svg.svg(W, H, "".join(out), "canary versus scored deltas per gate run", "plot deltas")


# --- lineage and HEAD moves ----------------------------------------------------------------
def lineage(generations: tuple[Generation, ...], moves: tuple[HeadMove, ...], head: int | None) -> str:
    """Generations as lanes, each node placed at the record that created it, parent → child
    edges, and HEAD's path through every move (commits and rollbacks) over time."""
    if not generations:
        return empty("No generations yet: gen-0 appears with the first `ledger run`.")
    lanes = sorted(g.n for g in generations)
    lane_of = {n: i for i, n in enumerate(lanes)}
    lane_h = 34 if len(lanes) <= 12 else max(10, 400 // len(lanes))
    top, left = 20, 96
    H = top + lane_h * (len(lanes) - 1) + 90
    axis_y = top + lane_h * (len(lanes) - 1) + 26
    events = list(moves) or [HeadMove(g.seq, g.time, g.kind, g.n, None) for g in generations]
    xs = Linear(-0.5, len(events) - 0.5, left, W - RIGHT)

    def y(n: int) -> float:
        return top + lane_h * (len(lanes) - 1 - lane_of[n])  # newest generation on top

    def x_at_seq(seq: int) -> float:
        k = next((i for i, e in enumerate(events) if e.seq >= seq), len(events) - 1)
        return xs(k)

    out = []
    label_every = _every(len(lanes), lane_h * len(lanes), 12)
    for i, n in enumerate(lanes):
        out.append(line(left, y(n), W - RIGHT, y(n), "lane"))
        if i % label_every == 0 or n == head:
            out.append(text(left - 10, y(n) + 4, f"gen-{n}", "tick" + (" headlbl" if n == head else ""), "end"))
    born = {g.n: x_at_seq(g.seq) for g in generations}
    for g in generations:
        if g.parent is not None and g.parent in born:
            x0, y0, x1, y1 = born[g.parent], y(g.parent), born[g.n], y(g.n)
            mx = (x0 + x1) / 2
            out.append(f'<path class="edge" d="M{svg.num(x0)},{svg.num(y0)} C{svg.num(mx)},{svg.num(y0)} '
                       f'{svg.num(mx)},{svg.num(y1)} {svg.num(x1)},{svg.num(y1)}"/>')
    pts = []
    for k, e in enumerate(events):
        if e.to is None or e.to not in lane_of:
            continue
        if pts:
            pts.append((xs(k), pts[-1][1]))
        pts.append((xs(k), y(e.to)))
    if pts:
        pts.append((W - RIGHT, pts[-1][1]))
    out.append(path(pts, "headpath", "HEAD over time"))
    for g in generations:
        verdict = "Accept" if g.verdict else ("base" if g.kind == "genesis" else g.kind)
        out.append(circle(born[g.n], y(g.n), 7, f"node v {cls(verdict)}",
                          f"gen-{g.n} {g.id[:15]} ({_when(g.time)}, {g.kind}); adapter {(g.adapter or 'none')[:15]}; "
                          f"parent {'gen-' + str(g.parent) if g.parent is not None else '-'}; {g.note}"))
    every = _every(len(events), W - RIGHT - left, 56)
    for k, e in enumerate(events):
        x = xs(k)
        if e.kind == "rollback" and e.to in lane_of:
            yy = y(e.to)
            out.append(polygon([(x, yy - 8), (x + 7, yy + 5), (x - 7, yy + 5)], "rollback",
                               f"rollback ({_when(e.time)}): gen-{e.frm} → gen-{e.to}" + (f" — {e.reason}" if e.reason else "")))
        if k % every == 0:
            out.append(text(x, axis_y, e.kind, "tick", "middle"))
            out.append(text(x, axis_y + 14, f"#{e.seq}", "tick dim", "middle"))
    if head is not None and head in lane_of:
        out.append(circle(W - RIGHT - 4, y(head), 4, "headdot", f"HEAD is gen-{head}"))
        out.append(text(W - RIGHT - 12, y(head) - 8, "HEAD", "headlbl", "end"))
    lx = left
    out.append(f'<g class="legend">{line(lx, H - 12, lx + 22, H - 12, "headpath")}{text(lx + 28, H - 8, "HEAD")}'
               f'{line(lx + 80, H - 12, lx + 102, H - 12, "edge")}{text(lx + 108, H - 8, "parent → child")}'
               f'{polygon([(lx + 226, H - 18), (lx + 233, H - 6), (lx + 219, H - 6)], "rollback")}'
               f'{text(lx + 240, H - 8, "rollback")}</g>')
    return svg.svg(W, H, "".join(out), "lineage of generations and HEAD moves", "plot lineage")


# --- a receipt's inline sparkline ----------------------------------------------------------
def spark(values: tuple[float, ...], w: int = 120, h: int = 24) -> str:
    if len(values) < 2:
        return ""
    xs = Linear(0, len(values) - 1, 2, w - 2)
    ys = Linear(min(values), max(values), h - 3, 3)
    return svg.svg(w, h, path([(xs(i), ys(v)) for i, v in enumerate(values)], "sparkpath",
                              f"{len(values)} steps: {fmt(values[0])} → {fmt(values[-1])}"), "loss sparkline", "spark")
