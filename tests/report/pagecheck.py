"""What in a report page could fetch something or run code (shared by the report and browser tests)."""

from __future__ import annotations

import re
import typing as tp
from html.parser import HTMLParser

_URL_ATTRS = {"src", "href", "xlink:href", "srcset", "action", "formaction", "poster", "data", "background"}
_FORBIDDEN_TAGS = {"script", "iframe", "frame", "object", "embed", "link", "base", "form", "audio", "video", "source"}


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problems: tp.List[str] = []
        self.tags: tp.Dict[str, int] = {}

    def handle_starttag(self, tag: str, attrs: tp.List[tp.Tuple[str, tp.Optional[str]]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if tag in _FORBIDDEN_TAGS:
            self.problems.append(f"<{tag}>")
        for name, value in attrs:
            value = value or ""
            if name.startswith("on"):
                self.problems.append(f"<{tag} {name}=...>: an event handler")
            if name in _URL_ATTRS and not (value.startswith("#") or value.startswith("data:")):
                self.problems.append(f"<{tag} {name}={value[:80]!r}>: fetches something")
            if name == "style" and re.search(r"url\(\s*['\"]?(?!#)", value):
                self.problems.append(f"<{tag} style=...url(...)>")
            if tag == "meta" and name == "http-equiv" and value.lower() == "refresh":
                self.problems.append("<meta http-equiv=refresh>")

    def handle_data(self, data: str) -> None:  # inside <style>: no import or url() but in-page ids
        if self.lasttag == "style" and (re.search(r"@import", data) or re.search(r"url\(\s*['\"]?(?!#)", data)):
            self.problems.append("a stylesheet that fetches something")


def parse(page: str) -> tp.Tuple[tp.List[str], tp.Dict[str, int]]:
    """``(problems, tag counts)`` of ``page``."""
    parser = _Tags()
    parser.feed(page)
    parser.close()
    problems = list(parser.problems)
    found = re.search(r"(?:https?|file|ftp)://[^\s\"'<]*", page, re.I)
    if found:
        problems.append(f"a URL in the page: {found.group()[:80]}")
    return problems, parser.tags


def self_contained_problems(page: str) -> tp.List[str]:
    return parse(page)[0]
