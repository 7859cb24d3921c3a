"""Tokenizers: a fixed character-level one for the project's own small models, and HF `tokenizers` ones.

Both expose the same small interface (encode/decode, special ids, chat template, save) so the engine,
trainer and eval never care which one a model directory holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from reference_trainer.errors import ModelLoadError, UserError
from reference_trainer.trace.records import make_dir, read_json, write_text

CHAR_TOKENIZER_FILE = "char_tokenizer.json"
HF_TOKENIZER_FILE = "tokenizer.json"
_SPECIALS = ("<pad>", "<bos>", "<eos>")
_REPLACEMENT = "?"


class CharTokenizer:
    """Ids 0..2 are <pad>, <bos>, <eos>; then "\\n" and printable ASCII chr(32..126): 99 ids.

    Characters outside the vocabulary map to '?' rather than failing: model outputs and eval prompts are
    arbitrary text, and a lossy id is better than a crash mid-run.
    """

    def __init__(self, vocab: list[str] | None = None) -> None:
        self.vocab: list[str] = (
            list(vocab) if vocab is not None else [*_SPECIALS, "\n"] + [chr(c) for c in range(32, 127)]
        )
        if self.vocab[:3] != list(_SPECIALS):
            raise ValueError(f"char tokenizer vocab must start with {list(_SPECIALS)}")
        self._index = {tok: i for i, tok in enumerate(self.vocab) if i >= len(_SPECIALS)}
        self._unk = self._index.get(_REPLACEMENT, len(_SPECIALS))
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.eos_token_ids: set[int] = {self.eos_id}
        self.has_chat_template = False
        self.chat_template: str | None = None

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = [self._index.get(ch, self._unk) for ch in text]
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        size, specials = len(self.vocab), len(_SPECIALS)
        return "".join(
            # ids past the vocab can come from a model with a padded embedding
            self.vocab[i] if 0 <= i < size else _REPLACEMENT
            for i in map(int, ids)
            if not (skip_special and 0 <= i < specials)
        )

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        raise ValueError("the char tokenizer has no chat template")

    def save(self, directory: str | Path) -> Path:
        path = make_dir(directory) / CHAR_TOKENIZER_FILE
        special = {"pad": self.pad_id, "bos": self.bos_id, "eos": self.eos_id}
        raw = {"type": "char", "vocab": self.vocab, "special": special}
        write_text(path, json.dumps(raw, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> CharTokenizer:
        path = Path(directory) / CHAR_TOKENIZER_FILE
        raw = _read_json(path)
        if raw.get("type") != "char":
            raise ModelLoadError(f"{path}: type is {raw.get('type')!r}, expected 'char'")
        vocab = raw.get("vocab")
        if not (isinstance(vocab, list) and all(isinstance(t, str) for t in vocab)):
            raise ModelLoadError(f"{path}: vocab is not a list of strings")
        if vocab[: len(_SPECIALS)] != list(_SPECIALS):
            raise ModelLoadError(f"{path}: vocab must start with {list(_SPECIALS)}")
        return cls(vocab)


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json stores special tokens either as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of a model directory ({} when absent); anything else is a one-line error."""
    if not path.is_file():
        return {}
    try:
        raw = read_json(path)  # the project's one JSON reader (depth, huge integers, not UTF-8)
    except UserError as err:
        raise ModelLoadError(str(err)) from None  # a ValueError too, as load_tokenizer's callers catch
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path}: not a JSON object")
    return raw


def _compile_chat_template(source: str) -> Any:
    """Compile like transformers does, but in jinja2's immutable sandbox: templates are untrusted input."""

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        # HF overrides jinja's tojson, which HTML-escapes; templates expect plain JSON.
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


class HFTokenizer:
    """A `tokenizers.Tokenizer` read from tokenizer.json plus the special tokens and chat template from
    tokenizer_config.json (eos ids also from generation_config.json / config.json)."""

    def __init__(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.directory = directory
        try:
            self._tok = Tokenizer.from_file(str(directory / HF_TOKENIZER_FILE))
        except Exception as err:  # tokenizers raises a bare Exception for a file it cannot use
            raise ModelLoadError(f"{directory / HF_TOKENIZER_FILE}: not a usable tokenizer ({err})") from None
        self._config = _read_json(directory / "tokenizer_config.json")
        self.bos_token = _token_content(self._config.get("bos_token"))
        self.eos_token = _token_content(self._config.get("eos_token"))
        self.pad_token = _token_content(self._config.get("pad_token"))
        self.bos_id = self._id(self.bos_token)
        self.eos_id = self._id(self.eos_token)
        self.pad_id = self._id(self.pad_token)
        if self.pad_id is None:
            self.pad_id = self.eos_id if self.eos_id is not None else 0
        # Chat models often stop on several ids (e.g. <|im_end|> and <|endoftext|>): collect them all.
        eos: set[int] = set() if self.eos_id is None else {self.eos_id}
        for name in ("generation_config.json", "config.json"):
            value = _read_json(directory / name).get("eos_token_id")
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, int):
                    eos.add(v)
        self.eos_token_ids: set[int] = eos
        template = self._config.get("chat_template")
        if isinstance(template, list):  # the older list-of-named-templates form
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = directory / "chat_template.jinja"
        if jinja_file.is_file():  # transformers >= 4.43 saves it beside the config; it wins there too
            template = jinja_file.read_text()
        self.chat_template: str | None = template or None
        self._compiled: Any = None

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        # No post-processor specials: callers decide about bos explicitly, chat templates carry their own.
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The messages rendered by the model's chat template, in jinja2's sandbox. A template that does not
        compile, that the sandbox stops (an escape attempt) or that fails while rendering (its own
        raise_exception included) is refused in one line naming the model directory."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        names = ("bos_token", "eos_token", "pad_token", "unk_token")
        specials = {k: v for k in names if (v := _token_content(self._config.get(k))) is not None}
        plain = json.loads(json.dumps(messages))  # only plain JSON data reaches the template
        try:
            if self._compiled is None:
                self._compiled = _compile_chat_template(self.chat_template)
            return self._compiled.render(
                messages=plain, add_generation_prompt=add_generation_prompt, **specials
            )
        except Exception as err:  # the template is untrusted code: whatever it does wrong, it is refused
            why = type(err).__name__ + "".join(
                f": {line[:200]}" for line in str(err).strip().splitlines()[:1]
            )
            raise ModelLoadError(f"{self.directory}: the chat template was refused ({why})") from None

    def save(self, directory: str | Path) -> Path:
        directory = make_dir(directory)
        write_text(directory / HF_TOKENIZER_FILE, self._tok.to_str(pretty=True))
        config = dict(self._config)
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
        write_text(directory / "tokenizer_config.json", text)
        return directory / HF_TOKENIZER_FILE


def _fits_model(tok: Any, model_dir: Path) -> Any:
    """`tok` if it can be the tokenizer of the model in `model_dir`: a char tokenizer has exactly the
    model's vocabulary (its models are never padded; a 4-token one beside a 99-token model decoded most
    tokens as '?', silently), and no tokenizer's end-of-sequence id lies past the model's embedding (it
    could never be sampled: generation would not stop). HF models may pad their embedding past the
    tokenizer, so a smaller HF vocabulary is fine."""
    try:
        vocab = _read_json(model_dir / "config.json").get("vocab_size")
    except ModelLoadError:  # read_config says what is wrong with it, where the model is loaded
        return tok
    if type(vocab) is not int:
        return tok  # no model beside it (a tokenizer directory), or read_config says what is wrong
    where = model_dir / (CHAR_TOKENIZER_FILE if isinstance(tok, CharTokenizer) else HF_TOKENIZER_FILE)
    if isinstance(tok, CharTokenizer) and tok.vocab_size != vocab:
        raise ModelLoadError(f"{where}: {tok.vocab_size} tokens, where config.json's vocab_size is {vocab}")
    if past := sorted(i for i in tok.eos_token_ids if i >= vocab):
        raise ModelLoadError(f"{where}: end-of-sequence id {past[0]} is past the model's {vocab} tokens")
    return tok


def load_tokenizer(model_dir: str | Path) -> CharTokenizer | HFTokenizer:
    """The tokenizer a model directory holds: char_tokenizer.json or tokenizer.json."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory not found: {model_dir}")
    if (model_dir / CHAR_TOKENIZER_FILE).is_file():
        return _fits_model(CharTokenizer.load(model_dir), model_dir)
    if (model_dir / HF_TOKENIZER_FILE).is_file():
        return _fits_model(HFTokenizer(model_dir), model_dir)
    raise FileNotFoundError(
        f"no tokenizer in {model_dir}: expected {CHAR_TOKENIZER_FILE} or {HF_TOKENIZER_FILE}"
    )
