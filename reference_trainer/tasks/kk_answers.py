"""Reading a Knights-and-Knaves answer written in free form: who the response says is a knight, by the roles
it finally states. Every rule (where the stated answer is, the phrasings read, hedges, reported speech,
references, a response cut off mid-sentence) is docs/eval.md's "Grading a Knights-and-Knaves answer".
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from reference_trainer.tasks.answer_extraction import MAX_RESPONSE_CHARS, ends_complete

_KNIGHT_WORDS = (
    r"knights?|truth-?tellers?|truth\s+tellers?|truthful|honest|tells?\s+the\s+truth|telling\s+the\s+truth"
)
_KNAVE_WORDS = r"knaves?|liars?|lying|lies|lie|dishonest|tells?\s+lies"
_ROLE = rf"(?P<role>(?i:{_KNIGHT_WORDS}|{_KNAVE_WORDS}))"
_IS_KNIGHT = re.compile(rf"(?:{_KNIGHT_WORDS})$", re.IGNORECASE)
# "Zoey is a knight or a knave", "... (it cannot be determined)": the person's role is left open.
_UNDECIDED_AFTER = re.compile(
    rf"\s*(?:or|/)\s*(?:an?\s+)?(?:{_KNIGHT_WORDS}|{_KNAVE_WORDS})\b"
    r"|[^.\n]*\b(?:cannot|can't|not)\s+be\s+determined|[^.\n]*\bunknown\b",
    re.IGNORECASE,
)
# A sentence that supposes, doubts or reports states nothing about the answer: the statement is skipped.
_NOT_ASSERTED_BEFORE = re.compile(
    r"\b(?:if|suppose|supposing|assume|assuming|assumption|might|could|may|would|whether|think|thought|"
    r"seems?|says?|said|claims?|claimed|states?|stated|tells?|told|unless|either|comments?|commented|remarks?|"
    r"remarked|mentions?|mentioned|notes?|noted|asserts?|asserted|declares?|declared|exclaims?|exclaimed|"
    r"insists?|insisted|argues?|argued|according)\b",
    re.IGNORECASE,
)
_CONTEXT_CHARS = 200  # how far back a hedge ("If ...") is looked for: bounded, so long text stays linear
_S = r"[ \t]"  # a statement stays on its line: "Knights: Zoey\nKnaves: ..." is two
_FILLER = (
    rf"(?:{_S}+(?i:is|are|was|were|must|be|has|have|to|does|do|did|both|all|therefore|thus|hence|so|also|then|"
    r"indeed|clearly|definitely|actually|certainly|each|the|an?))*"
)
# A statement lists at most this many people (K&K puzzles have 2 to 8): bounded, so that a response of one
# long list of names ("Zoey, Zoey, ...") is not rescanned from every name (quadratic)
_MAX_LISTED = 12
_COUNT = r"(?:two|three|four|five|six|seven|eight|\d)"
# Between the names of a list: a comma, "and" or both ("Zoey, Oliver and Max", "Zoey and Oliver and Max").
_AND = rf"(?:{_S}*,{_S}*(?:(?i:and|&){_S}+)?|{_S}+(?i:and|&){_S}+)"
# An aside between a name and its role: "Ella, on the other hand, is a knave".
_ASIDES = r"on\s+the\s+other\s+hand|however|in\s+turn|meanwhile|therefore|thus|then|though|in\s+contrast|"
_ASIDES += r"by\s+contrast|likewise|similarly|too|also"
_ASIDE = rf"(?:{_S}*,{_S}*(?i:{_ASIDES}){_S}*,)?"
# Names that are also English words: matched only with their capital ("Zoey will be" is no statement).
ENGLISH_NAMES = frozenset({
    "will", "grace", "jack", "lily", "mason", "rose", "mark", "bill", "hope", "joy", "faith", "may", "june",
    "april", "summer", "dawn", "eve", "amber", "ivy", "max", "ray", "chase", "hunter", "drew", "frank",
    "olive", "ruby", "violet", "willow", "hazel", "daisy", "pearl", "holly", "sky", "sage", "reed", "page",
    "miles", "august", "autumn", "crystal", "destiny", "heather", "jasmine", "iris", "art", "don", "guy",
    "pat", "sue", "rich", "king", "earl", "gene", "jay", "bud", "bob", "lucas", "logan", "aurora", "avery",
})  # fmt: skip


def _one_name(name: str, any_case: bool = False) -> str:
    if any_case:
        spelled = f"(?i:{re.escape(name)})"
    elif name.lower() in ENGLISH_NAMES:
        spelled = re.escape(name)
    else:
        spelled = f"(?:{re.escape(name)}|{re.escape(name.lower())})"
    return rf"(?<![A-Za-z]){spelled}(?![A-Za-z])"


def _name(names: Sequence[str], any_case: bool = False) -> str:
    """Any of the names, whole ("Eli" is not in "Elizabeth"), capitalised or in lower case (an English word
    only capitalised, unless `any_case`: where the phrasing says it is a name)."""
    return "(?:" + "|".join(_one_name(n, any_case) for n in names) + ")"


def _patterns(names: Sequence[str]) -> list[re.Pattern[str]]:
    name = _name(names)
    people = rf"(?P<people>(?i:both{_S}+)?{name}(?:{_AND}{name}){{0,{_MAX_LISTED}}})"
    # a name that a colon or a dash gives a role is a name in any case ("jack: knave", "will - knight")
    listed = rf"(?P<people>{_name(names, any_case=True)})"
    return [
        # Zoey is a knight / Penelope and David are both knaves / Zoey is not a knave / Zoey lies
        re.compile(
            rf"{people}{_ASIDE}{_FILLER}(?P<neg>{_S}+(?i:not|no|never)|(?i:n['’]t))?{_FILLER}{_S}+{_ROLE}\b"
        ),
        # Zoey: knave / Zoey - knave / | Zoey | Knight | / Zoey = knight
        re.compile(rf"{listed}{_S}*(?::|-|–|—|=|\||->|→|=>){_S}*(?i:an?{_S}+)?{_ROLE}\b"),
        # Zoey (knave) / Zoey is truthful (a knight)
        re.compile(
            rf"{people}(?P<gap>(?:(?!(?i:knight|knave))[^.;,\n()]){{0,30}}?)"
            rf"\({_S}*(?i:an?{_S}+)?{_ROLE}{_S}*\)"
        ),
        # Knights: Zoey, Oliver / The knaves are Penelope and David / The only knight is Riley
        re.compile(
            rf"(?:^[ \t\-*>#\d.()]*|\b(?i:the){_S}+(?P<only>(?i:only){_S}+)?)"
            rf"{_ROLE}{_S}*(?::|=|\b(?i:are|is)\b){_S}*{people}",
            re.MULTILINE,
        ),
        # Riley is the only knight / Only Riley is a knight
        re.compile(rf"{people}{_S}+(?i:is|are){_S}+(?i:the){_S}+(?P<only>(?i:only)){_S}+{_ROLE}\b"),
        re.compile(rf"\b(?P<only>(?i:only)){_S}+{people}{_S}+(?i:is|are){_S}+(?i:an?{_S}+)?{_ROLE}\b"),
    ]


def _everyone_patterns() -> list[re.Pattern[str]]:
    """Statements about every person: (?P<count>) says how many the statement counts, where it does."""
    return [
        # All three are knights / Everyone is a knave / Both are knights / They are all liars
        re.compile(
            rf"\b(?i:(?:all(?:{_S}+(?:(?P<count>{_COUNT})|of{_S}+them))?|everyone|everybody|both(?:{_S}+of{_S}+them)?"
            rf"|they{_S}+are{_S}+(?:all|both)))"
            rf"(?:{_S}+(?i:people|persons|inhabitants))?{_S}+(?i:are|is){_S}+(?i:an?{_S}+)?{_ROLE}\b"
        ),
        # None of them is a knight / No one is a knave / There are no knights (everyone: the other role)
        re.compile(
            rf"\b(?P<none>(?i:none(?:{_S}+of{_S}+them)?|no{_S}*one|nobody|neither(?:{_S}+of{_S}+them)?)"
            rf"{_S}+(?i:is|are){_S}+(?i:an?{_S}+)?){_ROLE}\b"
        ),
        re.compile(rf"\b(?P<none>(?i:there{_S}+(?:are|is){_S}+no){_S}+){_ROLE}\b"),
    ]


_COUNT_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
# "Luna could be either a knight or a knave", "We cannot determine whether Luna ...": a hedge on a person.
_ANY_ROLE = rf"(?:an?{_S}+)?(?:{_KNIGHT_WORDS}|{_KNAVE_WORDS})"
_ROLES_EITHER = rf"{_ANY_ROLE}{_S}+or{_S}+{_ANY_ROLE}"


def _hedge_patterns(names: Sequence[str]) -> list[re.Pattern[str]]:
    name = _name(names)
    people = rf"(?P<people>{name}(?:{_AND}{name}){{0,{_MAX_LISTED}}})"
    return [
        re.compile(
            rf"{people}{_S}+(?i:could|can|might|may){_S}+(?i:be){_S}+(?i:either{_S}+)?{_ROLES_EITHER}", re.I
        ),
        re.compile(rf"{people}{_S}+(?i:is|are){_S}+(?i:either){_S}+{_ROLES_EITHER}", re.I),
        re.compile(
            rf"(?i:cannot|can't|can{_S}+not){_S}+(?i:determine|tell|know|say){_S}+(?i:whether|if|what){_S}+{people}"
        ),
        re.compile(
            rf"{people}(?:'s{_S}+(?i:role|identity|type|status))?{_S}+(?i:is|are|remains?){_S}+(?i:unknown|undetermined|unclear|ambiguous)"
        ),
    ]


# The CONCLUSION marker opens a line (markdown allowed); quoted inside a line ('after the line "CONCLUSION:"',
# the prompt's instruction echoed) it marks nothing.
_CONCLUSION = re.compile(r"^[ \t#*_>]*conclusion\b", re.IGNORECASE | re.MULTILINE)


def _answer_region(text: str) -> tuple[str, bool]:
    """The stated answer and whether it is one (a block or a CONCLUSION), else the whole response."""
    blocks = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL | re.IGNORECASE)
    if blocks:
        return blocks[-1], True
    markers = list(_CONCLUSION.finditer(text))
    return (text[markers[-1].end() :], True) if markers else (text, False)


def _sentence_start(region: str, at: int) -> int:
    window = max(0, at - _CONTEXT_CHARS)
    return max(max(region.rfind(c, window, at) for c in ".!?;\n") + 1, window)


def _asserted(region: str, m: re.Match[str]) -> bool:
    """Is the match asserted: not in a sentence that supposes, doubts or reports?"""
    before = region[_sentence_start(region, m.start()) : m.start()]
    return not _NOT_ASSERTED_BEFORE.search(before + (m.groupdict().get("gap") or ""))


# Statements joined by "or" are alternatives: "Jacob is a knight, or Zoey is not a knave", "both are knights
# or both are knaves" leave the roles open.
_OR_AFTER = re.compile(r"[ \t]*,?[ \t]*\bor\b", re.IGNORECASE)
_OR_BEFORE = re.compile(r"\bor[ \t]*,?[ \t]*$", re.IGNORECASE)


def _left_open(region: str, m: re.Match[str]) -> bool:
    """Does the statement leave its role open: a role "or" another, "cannot be determined", or one of two
    statements joined by "or"?"""
    before = region[_sentence_start(region, m.start()) : m.start()]
    after = region[m.end() :]
    return bool(_UNDECIDED_AFTER.match(after) or _OR_AFTER.match(after) or _OR_BEFORE.search(before))


def _canonical(names: Sequence[str]) -> dict[str, str]:
    return {n.lower(): n for n in names}


# A statement by reference: "So is Alexander", "Neither is Zoey", "Zoey is too", "The same goes for Zoey"
# (the role of the statement before it); "the other three", "everyone else", "the rest" (the people the
# sentence has not named, or, where it names none, those no statement before it named).
def _reference_patterns(names: Sequence[str]) -> list[re.Pattern[str]]:
    name = _name(names)
    people = rf"(?P<people>{name}(?:{_AND}{name}){{0,{_MAX_LISTED}}})"
    kind = rf"(?:{_S}+(?:ones|people|persons|inhabitants))?"
    others = rf"(?i:(?:all{_S}+)?(?:the{_S}+)?(?:others|other(?:{_S}+(?P<count>{_COUNT}))?{kind}"
    others += rf"|rest(?:{_S}+of{_S}+them)?|remaining(?:{_S}+(?:{_COUNT}|ones|people))?"
    others += rf"|everyone{_S}+else|everybody{_S}+else))"
    return [
        re.compile(
            rf"\b(?i:so|as|neither|nor){_S}+(?i:is|are|does|do|must{_S}+be){_S}+{people}(?![ \t]+(?i:is|are))"
        ),
        re.compile(rf"{people}{_S}+(?i:is|are){_S}+(?i:one{_S}+)?(?i:too|as{_S}+well)\b"),
        re.compile(rf"\b(?i:the{_S}+same{_S}+(?:goes|holds|is{_S}+true){_S}+for){_S}+{people}"),
        re.compile(rf"\b(?P<others>{others}){_FILLER}(?P<neg>{_S}+(?i:not))?{_FILLER}{_S}+{_ROLE}\b"),
    ]


def _by_reference(region: str, names: Sequence[str], found: list) -> list:
    """`found` (sorted) with the statements by reference resolved in order: a "same" statement takes the
    role of the statement before it, "the others" the people its sentence (or, failing that, every
    statement before it) has not named."""
    name_re = re.compile(_name(names, any_case=True))
    canonical = _canonical(names)
    refs = []
    for pattern in _reference_patterns(names):
        for m in pattern.finditer(region):
            if _asserted(region, m) and not _left_open(region, m):
                refs.append((m.start(), m))
    resolved = list(found)
    for at, m in sorted(refs, key=lambda r: r[0]):
        before = sorted((s for s in resolved if s[0] < at and s[2] is not None), key=lambda s: s[0])
        if m.groupdict().get("others") is None:
            if before:
                people = [canonical[n.group(0).lower()] for n in name_re.finditer(m.group("people"))]
                resolved.append((at, people, before[-1][2]))
            continue
        named = {
            canonical[n.group(0).lower()] for n in name_re.finditer(region, _sentence_start(region, at), at)
        }
        named = named or {p for s in before for p in s[1]}
        people = [n for n in names if n not in named]
        count = m.group("count")
        counted = _COUNT_WORDS.get(count.lower()) if count and not count.isdigit() else count
        if people and named and (counted is None or int(counted) == len(people)):
            knight = bool(_IS_KNIGHT.match(m.group("role"))) != bool(m.group("neg"))
            resolved.append((at, people, knight))
    return sorted(resolved, key=lambda s: s[0])


def _statements(region: str, names: Sequence[str]) -> list[tuple[int, list[str], bool | None]]:
    """(position, people, is_knight) of every asserted statement in order; is_knight None where the
    statement leaves the role open (a hedge)."""
    found: list[tuple[int, list[str], bool | None]] = []
    name_re = re.compile(_name(names, any_case=True))
    canonical = _canonical(names)

    def people_of(m: re.Match[str]) -> list[str]:
        return [canonical[n.group(0).lower()] for n in name_re.finditer(m.group("people"))]

    for pattern in _patterns(names):
        for m in pattern.finditer(region):
            if not _asserted(region, m):
                continue
            knight = bool(_IS_KNIGHT.match(m.group("role"))) != bool(m.groupdict().get("neg"))
            people = people_of(m)
            open_role = _left_open(region, m)
            found.append((m.start(), people, None if open_role else knight))
            if m.groupdict().get("only") and not open_role:  # everyone else has the other role
                found.append((m.start(), [n for n in names if n not in people], not knight))
    for pattern in _everyone_patterns():
        for m in pattern.finditer(region):
            count = m.groupdict().get("count")
            counted = _COUNT_WORDS.get(count.lower()) if count and not count.isdigit() else count
            if counted is not None and int(counted) != len(names) or not _asserted(region, m):
                continue
            knight = bool(_IS_KNIGHT.match(m.group("role"))) != bool(m.groupdict().get("none"))
            found.append((m.start(), list(names), None if _left_open(region, m) else knight))
    for pattern in _hedge_patterns(names):
        found += [(m.start(), people_of(m), None) for m in pattern.finditer(region)]
    return _by_reference(region, names, sorted(found, key=lambda s: s[0]))


_ANSWER_SENTENCE = re.compile(
    r"\banswer\b[^.\n]{0,40}?\bis\b|\bfinal\s+answer\b|\bin\s+conclusion\b", re.IGNORECASE
)


def _in_answer_sentence(region: str, at: int) -> bool:
    return _ANSWER_SENTENCE.search(region[_sentence_start(region, at) : at]) is not None


def _cut_off(text: str, names: Sequence[str]) -> bool:
    """Does a response without a stated answer stop mid-sentence (cut at its token limit)? Its last
    statements are then reasoning that never concluded, as for a math response (docs/eval.md, rule 5),
    unless its last line is itself a whole statement (`Zoey: knave`, a table row `| Zoey | Knight |`)."""
    unquoted = re.sub(r"[\"'”’)\]}]+$", "", text.rstrip())  # a sentence may close inside quotes or brackets
    if ends_complete(unquoted):
        return False
    last = text.rstrip().rsplit("\n", 1)[-1].strip()
    last = re.sub(r"\s*(?:\(\d+\)|\||[,}])$", "", last)  # a list number "(2)", a table's bar, JSON's end
    return not any(m.end() == len(last) for pattern in _patterns(names) for m in pattern.finditer(last))


# A sentence in quotes ('Michael commented, "Michael is a knight"'): the puzzle's claim, quoted or echoed,
# not the response's conclusion. A quoted word or two is no sentence: JSON's {"Zoey": "a knight"}.
_QUOTED_SENTENCE = re.compile(r'"(?=[^"\n]*\s\S+\s)[^"\n]{1,300}"|“[^”\n]{1,300}”')


def parse_free_form_assignment(text: str, names: Sequence[str]) -> dict[str, bool] | None:
    """{name: is_knight} as the response finally states it (docs/eval.md); None unless every name gets a
    role."""
    if not names:
        return None
    region, stated = _answer_region(text[-MAX_RESPONSE_CHARS:])
    region = _QUOTED_SENTENCE.sub(lambda m: " " * len(m.group(0)), region)  # a quoted claim concludes nothing
    region = re.sub(r"[*`_\"]", "", region)  # markdown emphasis around names and roles, JSON's quotes
    statements = _statements(region, names)
    if not stated and _cut_off(region, names):
        # cut at its token limit: only what it stated as its answer counts ("So the answer is that both
        # Sofia and Amelia are knaves."), not reasoning that never concluded
        statements = [s for s in statements if _in_answer_sentence(region, s[0])]
    roles: dict[str, bool | None] = {}
    contradicted: set[str] = set()
    for _, people, knight in statements:
        for person in people:
            if stated and person in roles and roles[person] != knight:
                contradicted.add(person)  # two roles in the stated answer: it contradicts itself
            roles[person] = knight  # the last statement counts
    if contradicted or any(roles.get(n) is None for n in names):
        return None
    return {n: bool(roles[n]) for n in names}


def format_assignment(names: Sequence[str], knights: Sequence[bool]) -> str:
    """The public set's solution format: "(1) Zoe is a knave\\n(2) Max is a knight"."""
    roles = ("knight" if k else "knave" for k in knights)
    return "\n".join(f"({i + 1}) {n} is a {r}" for i, (n, r) in enumerate(zip(names, roles, strict=True)))
