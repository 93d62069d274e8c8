"""The report page: one self-contained HTML document (inline CSS and SVG, no script, no URL).

Everything dynamic is escaped (`svg.esc`); on top of that the page declares a Content-Security-
Policy that forbids scripts and every network fetch, so even a missed escape could not run code
or phone home. The page is a function of the model only — the same store gives the same bytes.
"""

from __future__ import annotations

from ledger.report import plots
from ledger.report.model import Receipt, Report
from ledger.report.svg import cls, esc, fmt

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

CSS = """
:root{--fg:#1d2329;--dim:#66707a;--line:#d9dee3;--bg:#fff;--panel:#f6f8fa;
--accept:#2e7d32;--noimp:#d89200;--regr:#c62828;--gamed:#8e24aa;--suite:#7f1d1d;--fail:#616161;--other:#455a64}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
main{max-width:1000px;margin:0 auto;padding:24px 20px 60px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:34px 0 6px;padding-top:8px;border-top:1px solid var(--line)}
p.lede,.caption{color:var(--dim);margin:0 0 10px}p.empty{color:var(--dim);font-style:italic;padding:18px;background:var(--panel);border-radius:6px}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}
.card{background:var(--panel);border-radius:8px;padding:8px 14px;min-width:110px}
.card b{display:block;font-size:20px}.card span{color:var(--dim);font-size:12px}
table{border-collapse:collapse;width:100%;margin:8px 0}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{font-size:12px;color:var(--dim);font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}td.t{white-space:nowrap}
.badge{display:inline-block;padding:0 7px;border-radius:9px;color:#fff;font-size:12px;font-weight:600;background:var(--other)}
.badge.Accept{background:var(--accept)}.badge.NoImprovement{background:var(--noimp)}.badge.Regressed{background:var(--regr)}
.badge.GamedTheEvaluator{background:var(--gamed)}.badge.SuiteChanged{background:var(--suite)}.badge.TrainingFailed{background:var(--fail)}
.badge.rung-Learned,.badge.rung-Judged{background:var(--accept)}.badge.rung-Ran,.badge.rung-Emitted{background:var(--noimp)}.badge.rung-Checked{background:var(--regr)}
.badge.Reproduced{background:var(--accept)}.badge.WithinTolerance{background:#558b2f}.badge.Diverged,.badge.MissingInputs{background:var(--regr)}
details{margin:0}summary{cursor:pointer;color:var(--dim)}
tr.detail td{border-bottom:1px solid var(--line);background:var(--panel)}
dl.kv{display:grid;grid-template-columns:190px 1fr;gap:2px 12px;margin:8px 0}dl.kv dt{color:var(--dim)}dl.kv dd{margin:0;word-break:break-all}
.turn{white-space:pre-wrap;word-break:break-word}
footer{margin-top:40px;color:var(--dim);font-size:12px}
svg.plot{display:block;max-width:100%;height:auto;background:#fff;border:1px solid var(--line);border-radius:6px}
svg.spark{display:block}
svg text{font:11px system-ui,sans-serif;fill:var(--fg)}
svg .tick{fill:var(--dim)}svg .dim{fill:#9aa3ab}svg .axis{fill:var(--dim);font-size:12px}svg .reason{fill:var(--dim);font-size:10px}
svg .legend text,svg text.legend{font-size:11px}
svg .grid{stroke:#eef1f4}svg .axisline{stroke:#9aa3ab}svg .zero{stroke:#6b7680;stroke-width:1.2}
svg .lane{stroke:#eef1f4}
svg .band{fill:#f9a825;fill-opacity:.22;stroke:#f9a825;stroke-opacity:.5}
svg .inc{stroke:#37474f;stroke-width:2.5}svg .conn{stroke:#90a4ae;stroke-dasharray:3 3}
svg .headline{fill:none;stroke:#37474f;stroke-width:1.5;stroke-dasharray:6 4}
svg .v{fill:var(--other);stroke:#fff;stroke-width:1.5}
svg .v.Accept{fill:var(--accept)}svg .v.NoImprovement{fill:var(--noimp)}svg .v.Regressed{fill:var(--regr)}
svg .v.GamedTheEvaluator{fill:var(--gamed)}svg .v.SuiteChanged{fill:var(--suite)}svg .v.TrainingFailed{fill:var(--fail)}
svg .v.base{fill:#78909c}
svg .vt{font-weight:600}svg .vt.Accept{fill:var(--accept)}svg .vt.NoImprovement{fill:var(--noimp)}svg .vt.Regressed{fill:var(--regr)}
svg .vt.GamedTheEvaluator{fill:var(--gamed)}svg .vt.SuiteChanged{fill:var(--suite)}svg .vt.TrainingFailed{fill:var(--fail)}
svg .unscored{stroke:#37474f;stroke-width:1.5}
svg .curve{fill:none;stroke-width:1.6}svg .curve.old{stroke:#cfd6dc;stroke-width:1}
svg .c0{stroke:#1f77b4}svg .c1{stroke:#d62728}svg .c2{stroke:#2ca02c}svg .c3{stroke:#9467bd}
svg .c4{stroke:#ff7f0e}svg .c5{stroke:#17becf}svg .c6{stroke:#8c564b}svg .c7{stroke:#e377c2}
svg .bar-s{fill:#1f77b4}svg .bar-k{fill:#ff7f0e}
svg .eta{stroke:#2e7d32;stroke-width:2;stroke-dasharray:4 2}svg .div{stroke:#8e24aa;stroke-width:2;stroke-dasharray:2 2}
svg .edge{fill:none;stroke:#b0bec5;stroke-width:1.5;stroke-dasharray:4 3}
svg .headpath{fill:none;stroke:#1565c0;stroke-width:3;stroke-linejoin:round}
svg .node{stroke:#fff;stroke-width:2}svg .rollback{fill:#c62828}
svg .headdot{fill:#1565c0}svg .headlbl{fill:#1565c0;font-weight:700}
svg .sparkpath{fill:none;stroke:#1f77b4;stroke-width:1.3}
"""


def _short(oid, n: int = 12) -> str:
    if not oid:
        return "-"
    s = str(oid)
    for prefix in ("b3:", "run:"):  # object ids, and tracked runs' ids (ledger/runs.py)
        if s.startswith(prefix):
            return s[:len(prefix) + n]
    return s


def _id(oid, n: int = 12) -> str:
    """A short id, with the full id in its tooltip."""
    if not oid:
        return "-"
    return f'<code title="{esc(oid)}">{esc(_short(oid, n))}</code>'


def _badge(name: str, prefix: str = "") -> str:
    return f'<span class="badge {cls(prefix + name)}">{esc(name or "-")}</span>'


def _bytes(n) -> str:
    if n is None:
        return "-"
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{n} B"


def _rate(x) -> str:
    return f"{x:,.0f}" if x is not None else "-"


def _when(t: str) -> str:
    return esc(t[:19].replace("T", " ")) if t else "-"


def _kv(rows) -> str:
    return '<dl class="kv">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


RECENT_ROWS = 12  # a long history shows its latest rows, with every row one click away


def _table(head: list[str], rows: list[str], noun: str, klass: str = "") -> str:
    """A table of `rows` (each one or more <tr>); past RECENT_ROWS, the latest rows and the
    whole table in a collapsed <details>."""
    k = f' class="{esc(klass)}"' if klass else ""

    def t(rs):
        return (f"<table{k}><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>"
                + "".join(rs) + "</tbody></table>")
    if len(rows) <= RECENT_ROWS:
        return t(rows)
    return (f'<p class="caption">The latest {RECENT_ROWS} of {len(rows)} {esc(noun)}:</p>' + t(rows[-RECENT_ROWS:])
            + f"<details><summary>all {len(rows)} {esc(noun)}</summary>{t(rows)}</details>")


def _section(anchor: str, title: str, lede: str, body: str) -> str:
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2><p class="lede">{esc(lede)}</p>{body}</section>'


# --- sections ------------------------------------------------------------------------------
def _cards(m: Report) -> str:
    accepted = sum(1 for c in m.cycles if c.outcome == "commit")
    refused = sum(1 for c in m.cycles if c.outcome == "refusal")
    items = [("HEAD", f"gen-{m.head}" if m.head is not None else "none"), ("generations", len(m.generations)),
             ("cycles accepted", accepted), ("cycles refused", refused), ("gate runs", len(m.judges)),
             ("rollbacks", m.counts.get("rollback", 0)), ("receipts", len(m.receipts)), ("turns recorded", m.turns_total),
             ("journal records", m.seq)]
    return '<div class="cards">' + "".join(f'<div class="card"><b>{esc(v)}</b><span>{esc(k)}</span></div>' for k, v in items) + "</div>"


def _cycles_table(m: Report) -> str:
    if not m.cycles and not m.judges:
        return ""
    by_verdict = {j.verdict_id: j for j in m.judges}
    rows = []
    for c in m.cycles:
        j = by_verdict.get(c.verdict_id)
        if j is not None and j.reasons:
            reasons = "<br>".join(f"<code>{esc(code)}</code> {esc(msg)}" for code, msg in j.reasons)
        else:
            reasons = "<br>".join(f"<code>{esc(r)}</code>" for r in c.reasons) or "-"
        result = (f"committed gen-{esc(c.generation)}" if c.outcome == "commit"
                  else f"refused; HEAD stayed gen-{esc(c.generation)}" if c.generation is not None else "refused")
        rows.append(f"<tr><td>{esc(c.cycle)}</td><td class=t>{_when(c.time)}</td><td>{_badge(c.verdict)}</td><td>{reasons}</td>"
                    f"<td>{result}</td><td class=num>{esc(c.turns if c.turns is not None else '-')}</td>"
                    f"<td>{_id(c.receipt)}</td><td>{_id(c.verdict_id)}</td></tr>")
    for k, j in enumerate(m.judges):
        if j.cycle is None:
            reasons = "<br>".join(f"<code>{esc(code)}</code> {esc(msg)}" for code, msg in j.reasons) or "-"
            rows.append(f"<tr><td>judge</td><td class=t>{_when(j.time)}</td><td>{_badge(j.verdict)}</td><td>{reasons}</td>"
                        f"<td>gate run outside a cycle</td><td class=num>-</td><td>{_id(j.candidate)}</td>"
                        f"<td>{_id(j.verdict_id)}</td></tr>")
    return _table(["cycle", "time", "verdict", "reasons", "result", "turns", "receipt / candidate", "verdict"], rows,
                  "cycle ends and gate runs")


def _score_table(m: Report) -> str:
    js = [j for j in m.judges if j.scored]
    if not js:
        return ""
    rows = [
        f"<tr><td>{esc(f'cycle {j.cycle}' if j.cycle is not None else 'judge')}</td><td>{_badge(j.verdict)}</td>"
        f"<td class=num>{fmt(j.incumbent_loss)}</td><td class=num>{fmt(j.candidate_loss)}</td>"
        f"<td class=num>{fmt(j.mean_delta)}</td><td class=num>{fmt(j.eta)}</td><td class=num>{fmt(j.p, 3)} ({esc(j.p_side)})</td>"
        f"<td class=num>{esc(j.wins)}/{esc(j.n)}</td><td class=num>{fmt(j.canary_delta)}</td><td>{esc(j.budget or '-')}</td></tr>"
        for j in js]
    return _table(["run", "verdict", "incumbent", "candidate", "mean Δ", "η", "p (better)", "wins", "canary Δ", "budget"],
                  rows, "scored gate runs")


def _moves_table(m: Report) -> str:
    if not m.head_moves:
        return ""
    def gen(n):
        return f"gen-{n}" if n is not None else "-"
    rows = [f"<tr><td class=num>{esc(h.seq)}</td><td class=t>{_when(h.time)}</td><td>{esc(h.kind)}</td>"
            f"<td>{esc(gen(h.frm))} → <b>{esc(gen(h.to))}</b></td><td>{esc(h.reason) or '-'}</td></tr>"
            for h in m.head_moves]
    return _table(["record", "time", "kind", "HEAD", "reason / note"], rows, "HEAD moves")


def _generations_table(m: Report) -> str:
    if not m.generations:
        return ""
    rows = [
        f"<tr><td>{'<b>HEAD →</b> ' if g.n == m.head else ''}gen-{esc(g.n)}</td><td>{_id(g.id)}</td>"
        f"<td>{esc(f'gen-{g.parent}' if g.parent is not None else '-')}</td><td>{_id(g.adapter)}</td>"
        f"<td>{_id(g.receipt)}</td><td>{_id(g.verdict)}</td><td>{esc(', '.join(g.capabilities) or '-')}</td>"
        f"<td>{esc(g.note) or '-'}</td></tr>" for g in m.generations]
    return _table(["generation", "id", "parent", "adapter", "receipt", "verdict", "capabilities", "note"], rows,
                  "generations")


def _receipt_detail(r: Receipt) -> str:
    mem_ratio = (f" (observed/predicted {r.memory_observed / r.memory_predicted:.2f}×)"
                 if r.memory_predicted and r.memory_observed is not None else "")
    rows = [("receipt", f"<code>{esc(r.id)}</code>"), ("journal record", f"#{esc(r.seq)} {esc(r.record_kind)} at {_when(r.time)}"),
            ("rung", _badge(r.rung, "rung-") + (f" stopped: {esc(r.stopped)}" if r.stopped else "")),
            ("trainer", esc(r.trainer)), ("plan", _id(r.plan, 64)), ("spec", _id(r.spec, 64)), ("target", esc(r.target or "-")),
            ("base weights", _id(r.base, 64)), ("tokenizer", _id(r.tokenizer, 64)), ("dataset", _id(r.dataset, 64)),
            ("adapter", _id(r.adapter, 64) if r.adapter else "none (nothing to judge)"),
            ("final checkpoint", _id(r.final_checkpoint, 64)), ("resumed from", _id(r.resumed_from, 64)),
            ("seeds", esc(", ".join(f"{k}={v}" for k, v in sorted(r.seeds.items())) or "-")),
            ("source", _id(r.source, 64)),
            ("versions", esc(", ".join(f"{k} {v}" for k, v in sorted(r.versions.items())) or "-")),
            ("device", esc(r.device or "-")),
            ("sandbox", "-" if r.sandboxed is None else ("Landlock" if r.sandboxed else "<b>unsandboxed</b>")),
            ("realizations", esc(", ".join(r.realizations) or "-")),
            ("memory predicted", f"{_bytes(r.memory_predicted)}" + (" = " + esc(", ".join(
                f"{k} {_bytes(v)}" for k, v in sorted(r.memory_lines.items()))) if r.memory_lines else "")),
            ("memory observed", f"{_bytes(r.memory_observed)}{esc(mem_ratio)}" + (f" — {esc(r.memory_method)}" if r.memory_method else "")),
            ("timings", f"train {fmt(r.train_s, 3)} s, {_rate(r.tokens_per_s)} tokens/s"),
            ("losses", f"{len(r.losses)} steps" + (f": first {fmt(r.losses[0])}, min {fmt(min(r.losses))}, last {fmt(r.losses[-1])}"
                                                  if r.losses else ""))]
    if r.rerun_of:
        rows.append(("re-run of", _id(r.rerun_of, 64)))
    for cid, outcome in r.comparisons:
        rows.append(("reproduced", f"{_badge(outcome)} comparison {_id(cid, 64)}"))
    rows.append(("reproduce it", f"<code>ledger reproduce {esc(_short(r.id, 16))}</code>"))
    return _kv(rows)


def _receipts_table(m: Report) -> str:
    if not m.receipts:
        return plots.empty("No receipts yet: `ledger train` or `ledger run` writes one per training run.")
    rows = []
    for r in m.receipts:
        where = f"cycle {r.cycle}" if r.cycle is not None else ("re-run" if r.rerun_of else "-")
        loss = f"{fmt(r.losses[0], 3)} → {fmt(r.losses[-1], 3)}" if r.losses else "-"
        rows.append(
            f'<tr><td>{_id(r.id)}</td><td>{esc(where)}</td><td>{_badge(r.rung, "rung-")}</td><td>{esc(r.trainer)}</td>'
            f"<td class=num>{esc(r.steps)}</td><td>{plots.spark(r.losses)}</td><td class=num>{loss}</td>"
            f"<td class=num>{_bytes(r.memory_predicted)} / {_bytes(r.memory_observed)}</td>"
            f"<td class=num>{_rate(r.tokens_per_s)}</td></tr>"
            f'<tr class="detail"><td colspan="9"><details><summary>identities, versions, memory, rung of {esc(_short(r.id))}'
            f"</summary>{_receipt_detail(r)}</details></td></tr>")
    return _table(["receipt", "where", "rung", "trainer", "steps", "loss", "first → last", "memory pred. / obs.", "tokens/s"],
                  rows, "receipts", "receipts")


def _runs_table(m: Report) -> str:
    if not m.runs:
        return plots.empty("No training runs yet: `ledger train`, `ledger run`, or `ledger.track(...)` in your own loop.")
    rows = []
    for r in m.runs:
        metrics = ", ".join(f"{k} {fmt(v, 3)}" for k, v in r.metrics if k != "loss")
        rows.append(
            f"<tr><td>{_id(r.run)}</td><td>{esc(r.trainer)}</td><td>{esc(r.name)}</td><td>{_badge(r.status)}</td>"
            f'<td>{_badge(r.rung, "rung-") if r.rung else "-"}</td><td class=num>{fmt(r.lr, 3) if r.lr is not None else "-"}</td>'
            f"<td class=num>{esc(r.r if r.r is not None else '-')}</td>"
            f"<td class=num>{esc(r.steps if r.steps is not None else '-')}</td>"
            f"<td class=num>{esc(r.batch if r.batch is not None else '-')}</td>"
            f"<td class=num>{fmt(r.final_loss, 3) if r.final_loss is not None else '-'}</td><td>{esc(metrics)}</td></tr>")
    # the loss curves of these runs are drawn once, in "Training loss per run" and the receipts table
    return _table(["run", "trainer", "name", "status", "rung", "lr", "r", "steps", "batch", "final loss", "metrics"],
                  rows, "runs", "runs")


def _experience(m: Report) -> str:
    if not m.turns_total:
        return plots.empty("No turns recorded yet: `ledger record TURNS.jsonl`.")
    rows = "".join(f'<tr><td class=num>t{esc(t.n)}</td><td class="turn">{esc(t.situation)}</td><td class="turn">{esc(t.action)}</td>'
                   f'<td class="turn">{esc(t.outcome) or "-"}</td><td>{"refusal" if t.refusal else ""}</td></tr>'
                   for t in m.recent_turns)
    return (f"<p>{esc(m.turns_total)} turns recorded in {esc(m.counts.get('record', 0))} batch(es); "
            f"{esc(m.counts.get('export', 0))} export(s) for cycles. The latest:</p>"
            "<table><thead><tr><th>turn</th><th>situation</th><th>action</th><th>outcome</th><th></th></tr></thead><tbody>"
            + rows + "</tbody></table>")


def _suites(m: Report) -> str:
    if not m.suites:
        return plots.empty("No suite sealed yet: `ledger seal SUITE_DIR`.")
    rows = "".join(f"<tr><td class=num>{esc(s.seq)}</td><td>{_when(s.time)}</td><td>{_id(s.suite_hash, 20)}</td>"
                   f"<td class=num>{esc(s.scored)} + {esc(s.canaries)}</td><td>{'re-pin' if s.repin else 'pin'}</td>"
                   f"<td>{esc(s.reason) or '-'}</td></tr>" for s in m.suites)
    return ("<table><thead><tr><th>record</th><th>time</th><th>suite hash</th><th>scored + canary</th><th></th>"
            "<th>reason</th></tr></thead><tbody>" + rows + "</tbody></table>")


def render(m: Report, version: str = "") -> str:
    head = f"gen-{m.head}" if m.head is not None else "no generation yet"
    body = "".join([
        f"<header><h1>ledger report</h1><p class=lede><code>{esc(m.store)}</code> — HEAD {esc(head)}, as of journal record "
        f"#{esc(m.seq)} ({_when(m.as_of)}, {_id(m.journal_head, 16)})</p>{_cards(m)}</header>",
        _section("scores", "Score history", "Action-span loss of the incumbent (HEAD) and the candidate at every gate run. "
                 "The shaded η band runs from the incumbent down to incumbent − η: a candidate is accepted only below it "
                 "(and significant, with ≥70% of documents improved and none >10% worse).",
                 plots.score_history(m.judges) + _score_table(m)),
        _section("verdicts", "Verdicts", "How each learn cycle ended: Accept commits a generation; every refusal is kept "
                 "with its reasons.", plots.verdict_timeline(m.cycles, m.judges) + _cycles_table(m)),
        _section("losses", "Training loss per run", "Per-step loss from each receipt, tracked runs included.",
                 plots.loss_curves(m.receipts)),
        _section("deltas", "Canary vs scored deltas", "Mean paired Δ (candidate − incumbent) per gate run. Scored must "
                 "fall below −η; canaries getting worse past their threshold while the scored set improves is "
                 "GamedTheEvaluator.", plots.deltas(m.judges)),
        _section("lineage", "Lineage and HEAD", "Generations (lanes), parent → child edges, and HEAD's path through "
                 "commits and rollbacks; nothing is ever deleted.",
                 plots.lineage(m.generations, m.head_moves, m.head) + _moves_table(m) + _generations_table(m)),
        _section("runs", "Runs", "Every training run — ledger's own and those logged with `ledger.track` — with its key "
                 "hyper-parameters; the same table as `ledger runs`.", _runs_table(m)),
        _section("receipts", "Receipts", "Every training run, bound by identity. Expand a row for what it pinned; "
                 "`ledger reproduce ID` re-runs it and compares field by field.", _receipts_table(m)),
        _section("experience", "Experience", "Turns the image recorded (situation, action verbatim, outcome).", _experience(m)),
        _section("suites", "Sealed suites", "Suites pinned by hash (per-document scores stay sealed and are not in "
                 "this report).", _suites(m)),
        f"<footer>Generated by ledger{(' ' + esc(version)) if version else ''} from the journal (record #{esc(m.seq)}). "
        "Self-contained: no scripts, no network.</footer>",
    ])
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>ledger report — {esc(head)}</title><style>{CSS}</style></head>"
            f"<body><main>{body}</main></body></html>\n")
