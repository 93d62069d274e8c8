"""Parse a report page with the standard library and answer structural questions about it."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"meta", "br", "img", "input", "link", "hr", "col", "area", "base", "embed", "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict
    section: str | None
    children: list = field(default_factory=list)
    parent: "Node | None" = None

    def descendants(self):
        for c in self.children:
            yield c
            yield from c.descendants()


class Page(HTMLParser):
    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {}, None)
        self.cur = self.root
        self.nodes: list[Node] = []
        self.section: str | None = None
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = {k: (v or "") for k, v in attrs}
        if tag == "section":
            self.section = a.get("id")
        n = Node(tag, a, self.section, parent=self.cur)
        self.cur.children.append(n)
        self.nodes.append(n)
        if tag not in VOID:
            self.cur = n

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        n = self.cur
        while n is not self.root and n.tag != tag:
            n = n.parent
        if n is not self.root:
            self.cur = n.parent
        if tag == "section":
            self.section = None

    def handle_data(self, data):
        self.text.append(data)

    def all(self, tag: str) -> list[Node]:
        return [n for n in self.nodes if n.tag == tag]

    def plots(self) -> dict[str, list[Node]]:
        """section id -> its <svg class="plot ..."> elements."""
        out: dict[str, list[Node]] = {}
        for n in self.all("svg"):
            if "plot" in n.attrs.get("class", "").split():
                out.setdefault(n.section, []).append(n)
        return out

    @property
    def plain(self) -> str:
        return "".join(self.text)
