"""The report page without a browser: self-contained (no URL, no script), XSS-safe, sensible on
an empty store, deterministic, and with a plot per section drawn from the store's facts."""

from __future__ import annotations

import json
import re

import pytest

from ledger import experience, generations
from ledger.report import gather, render
from ledger.store import Store
from tests.conftest import ledger_cmd
from tests.report.htmlcheck import Page

EVIL = '<script>alert("pwned")</script>'
EVIL_ATTR = '"><img src=x onerror=alert(1)>'
EVIL_URL = "https://evil.example/x.js"


def build_hostile_store(root):
    """A small store written through real transactions, with hostile text in every user field
    the report shows: turns, generation notes, a rollback reason, a refusal's reasons."""
    s = Store.init(root)
    turns = [{"situation": f"{EVIL} {EVIL_URL}", "action": EVIL_ATTR, "outcome": "</td></tr></table>" + EVIL},
             {"situation": "plain", "action": "refuse: no", "refusal": True}]
    experience.record(s, experience.parse_turns("\n".join(json.dumps(t) for t in turns)))
    with s.transaction("genesis") as tx:
        base = tx.put_bytes(b"pretend weights")
        generations.new_generation(tx, s, base=base, note=f"genesis {EVIL}")
    with s.transaction("commit") as tx:
        g = generations.new_generation(tx, s, note=EVIL_ATTR)
        tx.payload.update({"cycle": 1, "verdict_name": "Accept"})
    with s.transaction("refusal") as tx:
        tx.payload.update({"cycle": 2, "verdict_name": f"No{EVIL}", "reasons": [EVIL, EVIL_ATTR]})
    generations.rollback(s, reason=f"because {EVIL}")
    return s, g


def _no_urls_or_scripts(page: Page, text: str):
    assert not page.all("script") and not page.all("link") and not page.all("iframe") and not page.all("img")
    for n in page.nodes:
        for k, v in n.attrs.items():
            assert not k.startswith("on"), f"event handler attribute {k} on <{n.tag}>"
            assert "://" not in v and not v.lstrip().startswith("//"), f"URL in <{n.tag} {k}={v!r}>"
    css = "".join(n.attrs.get("style", "") for n in page.nodes) + "".join(
        t for t in re.findall(r"<style>(.*?)</style>", text, re.S))
    assert "url(" not in css and "@import" not in css
    csp = [n for n in page.all("meta") if n.attrs.get("http-equiv", "").lower() == "content-security-policy"]
    assert csp and "default-src 'none'" in csp[0].attrs["content"] and "script-src" not in csp[0].attrs["content"]


def test_hostile_text_is_escaped(tmp_path):
    s, _ = build_hostile_store(tmp_path)
    text = render(gather(s))
    page = Page(text)
    _no_urls_or_scripts(page, text)
    assert "<script" not in text.lower() and "onerror=" not in text.replace("onerror=alert(1)&gt;", "")
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in text
    # the text survives, verbatim, as text (the turns table, notes, reasons, rollback reason)
    plain = page.plain
    assert plain.count(EVIL) >= 5 and EVIL_ATTR in plain and EVIL_URL in plain
    assert f"because {EVIL}" in plain and f"No{EVIL}" in plain
    # markup structure unharmed: the turns table still has its two rows after the injected </table>
    exp = [n for n in page.all("tr") if n.section == "experience"]
    assert len(exp) == 3  # header + 2 turns


def test_empty_store_renders_a_sensible_report(tmp_path):
    s = Store.init(tmp_path)
    m = gather(s)
    assert m.generations == () and m.receipts == () and m.head is None and m.seq == 1
    text = render(m)
    page = Page(text)
    _no_urls_or_scripts(page, text)
    assert {n.attrs["id"] for n in page.all("section")} == {
        "scores", "verdicts", "losses", "deltas", "lineage", "runs", "receipts", "experience", "suites"}
    assert page.plots() == {}  # nothing to draw: every section says so instead
    assert len([n for n in page.all("p") if "empty" in n.attrs.get("class", "")]) == 9
    assert "No generations yet" in page.plain and "HEAD no generation yet" in page.plain


def test_cli_report_empty_store_and_bad_output(tmp_path):
    Store.init(tmp_path)
    p = ledger_cmd("report", "-o", "r.html", "--json", cwd=tmp_path, check=True)
    info = json.loads(p.stdout)
    assert info["path"] == "r.html" and info["generations"] == 0 and info["seq"] == 1
    assert (tmp_path / "r.html").stat().st_size == info["bytes"]
    assert not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]
    p = ledger_cmd("report", "-o", "-", cwd=tmp_path, check=True)
    assert p.stdout.startswith("<!DOCTYPE html>") and p.stdout == (tmp_path / "r.html").read_text()
    p = ledger_cmd("report", "-o", "-", "--json", cwd=tmp_path)
    assert p.returncode == 2 and "stdout" in p.stderr
    (tmp_path / "adir").mkdir()
    p = ledger_cmd("report", "-o", "adir", cwd=tmp_path)
    assert p.returncode == 2 and "directory" in p.stderr and "Traceback" not in p.stderr
    elsewhere = tmp_path.parent / f"{tmp_path.name}-no-store"  # no .ledger here or above (found like git)
    elsewhere.mkdir()
    p = ledger_cmd("report", cwd=elsewhere)
    assert p.returncode == 2 and "no ledger store" in p.stderr


@pytest.mark.slow
def test_demo_report_has_a_plot_per_section(demo_store):
    s = Store.open(demo_store)
    m = gather(s)
    text = render(m)
    assert text == render(gather(Store.open(demo_store)))  # same store, same bytes
    page = Page(text)
    _no_urls_or_scripts(page, text)
    plots = page.plots()
    assert set(plots) == {"scores", "verdicts", "losses", "deltas", "lineage"}
    for section, svgs in plots.items():
        shapes = [d for svg in svgs for d in svg.descendants() if d.tag in ("path", "circle", "rect")]
        assert len(shapes) >= 2, section

    def in_legend(n):
        while n is not None:
            if n.tag == "g" and "legend" in n.attrs.get("class", "").split():
                return True
            n = n.parent
        return False

    def shapes(section, tag, cls):
        return [d for svg in plots[section] for d in svg.descendants()
                if d.tag == tag and cls in d.attrs.get("class", "").split() and not in_legend(d)]

    scored = [j for j in m.judges if j.scored]
    # one candidate point per scored gate run, coloured by its verdict, and an η band each
    cands = shapes("scores", "circle", "v")
    assert [c.attrs["class"].split()[-1] for c in cands] == [j.verdict for j in scored]
    assert len(shapes("scores", "rect", "band")) == len(scored)
    # the timeline has a marker per cycle end, in the cycle's verdict colour
    marks = shapes("verdicts", "circle", "v")
    assert [c.attrs["class"].split()[-1] for c in marks] == [c.verdict for c in m.cycles]
    # a loss curve per receipt, with as many points as the receipt has steps
    curves = shapes("losses", "path", "curve")
    curves = [c for c in curves if c.attrs.get("d", "").count("L") > 0]
    assert [c.attrs["d"].count("L") + 1 for c in curves] == [len(s.get_json(r.id)["losses"]) for r in m.receipts]
    # scored and canary bars per scored run
    assert len(shapes("deltas", "rect", "bar-s")) == len(scored) == len(shapes("deltas", "rect", "bar-k"))
    # lineage: a node per generation, a rollback marker per rollback record
    kinds = [r["kind"] for r in s.journal.records()]
    assert len(shapes("lineage", "circle", "node")) == len(m.generations)
    assert len(shapes("lineage", "path", "rollback")) == kinds.count("rollback")
    # the receipt browser: a row and an expandable detail per receipt, with its identities
    details = [n for n in page.all("details") if n.section == "receipts"]
    assert len(details) == len(m.receipts)
    for r in m.receipts:
        body = s.get_json(r.id)
        for k in ("plan", "base", "tokenizer", "dataset", "adapter"):
            assert f'title="{body[k]}"' in text
        assert body["versions"]["torch"] in text and body["rung"] in text


@pytest.mark.slow
def test_report_keeps_sealed_numbers_out(demo_store):
    s = Store.open(demo_store)
    text = render(gather(s))
    for r in s.journal.records():
        if r["kind"] == "judge":
            sealed = s.get_json(r["payload"]["verdict"])["sealed"]
            for doc, row in {**sealed["scored"], **sealed["canary"]}.items():
                assert doc not in text
                assert f"{row['candidate']:.4f}" not in text or f"{row['candidate']:.4f}" in _aggregates(s)


def _aggregates(s) -> str:
    """Aggregate numbers the report may show (a per-document value can coincide with one)."""
    out = []
    for r in s.journal.records():
        if r["kind"] == "judge":
            st = s.get_json(r["payload"]["verdict"])["statistics"]
            out += [f"{v:.4f}" for part in st.values() if part for v in part.values() if isinstance(v, float)]
    return " ".join(out)
