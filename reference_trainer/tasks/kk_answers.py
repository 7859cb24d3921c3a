"""Reading a Knights-and-Knaves answer written in free form: who the response says is a knight.

The stated answer is the last `<answer>` block, else what follows the last CONCLUSION marker, else the whole
response. Statements are read in these phrasings (names are matched whole and with their capital):

    Zoey is a knight / Zoey must be a knave / Zoey is not a knave (a knight)
    Penelope and David are knaves / Both Zoey and Oliver are knights
    Zoey: knave / Zoey - knave / | Zoey | Knight | (a table row) / Zoey = knight / Zoey (knave)
    Zoey is truthful (a knight)
    Knights: Zoey, Oliver / The knaves are Penelope and David

A statement is no assignment when it hedges ("Zoey is a knight or a knave", "... cannot be determined") or
sits in a sentence that supposes, reports or doubts ("If Zoey is a knight", "one might think Penelope is a
knave", "Zoey says Oliver is a knave"). In a stated answer (block or CONCLUSION) the first role given to each
person counts and reading stops once everyone has one, so later prose ("Note: one might think ...") cannot
override it; a person given both roles, or hedged, before that makes the answer unreadable. In a response
without a stated answer, the last statement about each person wins, unless the response stops mid-sentence
(cut at its token limit: then it never concluded, and states nothing). Every person must get a role.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from reference_trainer.tasks.answer_extraction import MAX_RESPONSE_CHARS, ends_complete

_ROLE = r"(?P<role>(?i:knights?|knaves?))"
# "Zoey is a knight or a knave", "... (it cannot be determined)": the person's role is left open.
_UNDECIDED_AFTER = re.compile(
    r"\s*(?:or|/)\s*(?:an?\s+)?(?:knight|knave)"
    r"|[^.\n]*\b(?:cannot|can't|not)\s+be\s+determined|[^.\n]*\bunknown\b",
    re.IGNORECASE,
)
# A sentence that supposes, doubts or reports states nothing about the answer: the statement is skipped.
_NOT_ASSERTED_BEFORE = re.compile(
    r"\b(?:if|suppose|supposing|assume|assuming|assumption|might|could|may|would|whether|think|thought|"
    r"seems?|says?|said|claims?|claimed|states?|stated|tells?|told|unless|either)\b",
    re.IGNORECASE,
)
_CONTEXT_CHARS = 200  # how far back a hedge ("If ...") is looked for: bounded, so long text stays linear
_S = r"[ \t]"  # a statement stays on its line: "Knights: Zoey\nKnaves: ..." is two
_FILLER = (
    rf"(?:{_S}+(?i:is|are|was|were|must|be|has|have|to|both|all|therefore|thus|hence|so|also|then|indeed|"
    r"clearly|definitely|actually|certainly|each|the|an?))*"
)


def _name(names: Sequence[str]) -> str:
    """Any of the names, whole and with its capital ("Eli" is not in "Elizabeth", "Will" not "will")."""
    return "(?:" + "|".join(rf"(?<![A-Za-z]){re.escape(n)}(?![A-Za-z])" for n in names) + ")"


def _patterns(names: Sequence[str]) -> list[re.Pattern[str]]:
    name = _name(names)
    people = rf"(?P<people>(?i:both{_S}+)?{name}(?:{_S}*,{_S}*{name})*"
    people += rf"(?:{_S}*,?{_S}*(?i:and|&){_S}+{name})?)"
    return [
        # Zoey is a knight / Penelope and David are both knaves / Zoey is not a knave
        re.compile(rf"{people}{_FILLER}(?P<neg>{_S}+(?i:not))?{_FILLER}{_S}+{_ROLE}\b"),
        # Zoey: knave / Zoey - knave / | Zoey | Knight | / Zoey = knight
        re.compile(rf"{people}{_S}*(?::|-|–|—|=|\||->|→){_S}*(?i:an?{_S}+)?{_ROLE}\b"),
        # Zoey (knave) / Zoey is truthful (a knight)
        re.compile(
            rf"{people}(?P<gap>(?:(?!(?i:knight|knave))[^.;,\n()]){{0,30}}?)"
            rf"\({_S}*(?i:an?{_S}+)?{_ROLE}{_S}*\)"
        ),
        # Knights: Zoey, Oliver / The knaves are Penelope and David (at a line start or after "the")
        re.compile(
            rf"(?:^[ \t\-*>#\d.()]*|\b(?i:the){_S}+(?i:only{_S}+)?)"
            rf"{_ROLE}{_S}*(?::|=|\b(?i:are|is)\b){_S}*{people}",
            re.MULTILINE,
        ),
    ]


def _answer_region(text: str) -> tuple[str, bool]:
    """The stated answer and whether it is one (a block or a CONCLUSION), else the whole response."""
    blocks = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL | re.IGNORECASE)
    if blocks:
        return blocks[-1], True
    idx = text.upper().rfind("CONCLUSION")
    return (text[idx + len("CONCLUSION") :], True) if idx >= 0 else (text, False)


def _statements(region: str, names: Sequence[str]) -> list[tuple[int, list[str], bool | None]]:
    """(position, people, is_knight) of every asserted statement in order; is_knight None where the
    statement leaves the role open."""
    found = []
    name_re = re.compile(_name(names))
    for pattern in _patterns(names):
        for m in pattern.finditer(region):
            window = max(0, m.start() - _CONTEXT_CHARS)
            sentence_start = max(region.rfind(c, window, m.start()) for c in ".!?;\n") + 1
            sentence_start = max(sentence_start, window)
            if _NOT_ASSERTED_BEFORE.search(
                region[sentence_start : m.start()] + (m.groupdict().get("gap") or "")
            ):
                continue
            knight = m.group("role").lower().startswith("knight") != bool(m.groupdict().get("neg"))
            people = [n.group(0) for n in name_re.finditer(m.group("people"))]
            found.append((m.start(), people, None if _UNDECIDED_AFTER.match(region, m.end()) else knight))
    return sorted(found, key=lambda s: s[0])


def _cut_off(text: str, names: Sequence[str]) -> bool:
    """Does a response without a stated answer stop mid-sentence (cut at its token limit)? Its last
    statements are then reasoning that never concluded, as for a math response (answer_extraction, rule 5),
    unless its last line is itself a whole statement (`Zoey: knave`, a table row `| Zoey | Knight |`)."""
    unquoted = re.sub(r"[\"'”’)\]]+$", "", text.rstrip())  # a sentence may close inside quotes or brackets
    if ends_complete(unquoted):
        return False
    last = text.rstrip().rsplit("\n", 1)[-1].strip()
    last = re.sub(r"\s*(?:\(\d+\)|\|)$", "", last)  # a list number "(2)" or a table's bar after the statement
    return not any(m.end() == len(last) for pattern in _patterns(names) for m in pattern.finditer(last))


def parse_free_form_assignment(text: str, names: Sequence[str]) -> dict[str, bool] | None:
    """{name: is_knight} as the response states it (policy above); None unless every name gets a role."""
    if not names:
        return None
    region, stated = _answer_region(text[-MAX_RESPONSE_CHARS:])
    region = re.sub(r"[*`_]", "", region)  # markdown emphasis around names and roles
    if not stated and _cut_off(region, names):
        return None
    roles: dict[str, bool | None] = {}
    for _, people, knight in _statements(region, names):
        for person in people:
            if not stated:
                if knight is not None:
                    roles[person] = knight  # no stated answer: the last statement wins
            elif person not in roles:
                roles[person] = knight
            elif roles[person] != knight:
                roles[person] = None  # two roles, or a hedge, before the answer was complete
        if stated and len(roles) == len(names):
            break
    if any(roles.get(n) is None for n in names):
        return None
    return {n: bool(roles[n]) for n in names}


def format_assignment(names: Sequence[str], knights: Sequence[bool]) -> str:
    """The public set's solution format: "(1) Zoe is a knave\\n(2) Max is a knight"."""
    roles = ("knight" if k else "knave" for k in knights)
    return "\n".join(f"({i + 1}) {n} is a {r}" for i, (n, r) in enumerate(zip(names, roles, strict=True)))
