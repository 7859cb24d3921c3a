"""reference_trainer/inputs.py: the one guard of each input concept (a regular file of bounded size, YAML
with bounded aliases, a path that stays inside its root), and printable terminal output. Each test here
fails without its guard: a FIFO blocks the reader forever (run under a deadline here), a billion-laughs
file expands to 10^9 nodes, a `..` path leads outside."""

from __future__ import annotations

import os
import threading

import pytest

from reference_trainer.errors import UserError, printable
from reference_trainer.inputs import (
    BoundedReader,
    expanded_size,
    inside,
    load_yaml,
    open_input,
    plain_name,
    read_input,
)
from reference_trainer.trace.records import read_json, read_jsonl

BOMB = b"""a: &a [x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
title: [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def _within(seconds: float, call, *args):
    """Run `call` in a thread and return what it raised; a reader that blocks fails the test, not hangs it."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call(*args)
        except BaseException as err:  # noqa: BLE001 (handed to the test)
            raised.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{call.__name__} blocked on its input"
    return raised[0] if raised else None


@pytest.mark.parametrize("reader", [read_input, read_json, read_jsonl, open_input])
def test_a_fifo_is_refused_at_once_by_every_reader(tmp_path, reader):
    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)
    err = _within(10, reader, fifo)
    assert isinstance(err, UserError) and "not a regular file" in str(err)


@pytest.mark.parametrize("reader", [read_input, read_json, read_jsonl])
def test_devices_and_folders_are_refused(tmp_path, reader):
    with pytest.raises(UserError, match="not a regular file"):
        reader("/dev/zero")  # never ends: read whole, it took 23 GB
    with pytest.raises(UserError, match="is a directory"):
        reader(tmp_path)
    with pytest.raises(UserError, match="file name too long"):
        reader(tmp_path / ("x" * 5000))


def test_a_file_past_its_bound_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_bytes(b'{"a": 1}\n' * 100)
    assert len(read_input(path, limit=900)) == 900
    with pytest.raises(UserError, match="more than the 899 bytes"):
        read_input(path, limit=899)
    with pytest.raises(UserError, match="more than the 899 bytes"):
        read_jsonl(path, limit=899)


def test_a_file_that_grows_while_read_is_cut_at_its_bound(tmp_path):
    path = tmp_path / "growing.jsonl"
    path.write_bytes(b"x\n" * 10)
    with open_input(path) as fh:
        lines = BoundedReader(fh, path, limit=20)
        with open(path, "ab") as more:  # a writer appends after the size was checked
            more.write(b"x\n" * 10)
        with pytest.raises(UserError, match="more than the 20 bytes"):
            list(lines)
        assert lines.read == 22  # it stopped at the first line past the bound


def test_a_billion_laughs_is_refused_before_it_is_built():
    with pytest.raises(UserError, match="more than 100,000 YAML nodes"):
        load_yaml(BOMB, "bomb.yaml")  # 9^9 = 387,420,489 nodes expanded; 324 bytes written
    assert load_yaml(b"base: &b {t: 0.6}\nrun: *b\n", "ok.yaml") == {"base": {"t": 0.6}, "run": {"t": 0.6}}


def test_yaml_cycles_and_deep_nesting_are_one_line():
    with pytest.raises(UserError, match="cycle"):
        load_yaml(b"a: &a [*a]\n", "cycle.yaml")
    with pytest.raises(UserError, match="nested too deeply|not valid YAML"):
        load_yaml(b"[" * 5000 + b"]" * 5000, "deep.yaml")
    with pytest.raises(UserError, match="not valid YAML"):
        load_yaml(b"a: [", "broken.yaml")
    with pytest.raises(UserError, match="not valid YAML"):
        load_yaml(b"!!python/object/apply:os.system [echo]", "evil.yaml")


def test_the_expanded_size_counts_each_alias_without_expanding_it():
    import yaml

    node = yaml.compose(b"a: &a [1, 2, 3]\nb: [*a, *a]\n")
    # mapping 1 + key a 1 + [1,2,3] 4 + key b 1 + [*a, *a] (1 + 4 + 4)
    assert expanded_size(node) == 1 + 1 + 4 + 1 + 9


@pytest.mark.parametrize(
    "path",
    ["../outside.jsonl", "a/../../x", "/abs/x.jsonl", "", "a\0b", "x" * 256, "a/" * 2100 + "b"],
)
def test_a_path_from_a_file_stays_inside_its_root(tmp_path, path):
    with pytest.raises(UserError):
        inside(tmp_path, path, "data.file")


def test_paths_inside_their_root_are_kept(tmp_path):
    assert inside(tmp_path, "sub/data.jsonl", "data.file") == tmp_path / "sub" / "data.jsonl"
    assert inside(tmp_path, "a..b.jsonl", "data.file") == tmp_path / "a..b.jsonl"  # not a `..` name


@pytest.mark.parametrize(
    "name", ["/abs/foreign_dir", "../../escaped", ".hidden", "a/b", "x\x1b]0;t", "x" * 129]
)
def test_a_name_that_becomes_a_folder_is_plain(name):
    with pytest.raises(UserError, match="not a plain name"):
        plain_name(name, "name")
    assert plain_name("kk_logic-ood.v2", "name") == "kk_logic-ood.v2"


def test_control_bytes_are_shown_not_sent_to_the_terminal():
    title = "\x1b]0;pwned\x07\x1b[2J\x9bdone\ttab"
    shown = printable(title)
    assert "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown
    assert shown == "\\x1b]0;pwned\\x07\\x1b[2J\\x9bdone\ttab"
    assert printable("a\nb\rc", newlines=False) == "a\\nb\\rc"
