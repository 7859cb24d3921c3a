"""`rlbench modes`: the mode registry (reference_trainer/modes.py), as train, profile, compare and simulate
read it."""

from __future__ import annotations

import textwrap
from typing import Annotated, Any

import typer

from rlbench.options import echo

WIDTH = 110


def registry_doc() -> dict[str, Any]:
    """The registry as JSON: every mode, and every option with the modes that take it."""
    from reference_trainer.modes import MODES, STRATEGY_TABLE
    from reference_trainer.option import Option, options_of
    from reference_trainer.speculation.drafters import vllm_spec_options
    from reference_trainer.tasks import RUN_TASK_OPTIONS, TASKS

    def option(o: Option) -> dict[str, Any]:
        return {
            "type": o.type + (" | null" if o.nullable else ""),
            "default": o.default,
            "choices": list(o.choices) or None,
            "minimum": o.minimum,
            "workers_gt_1_only": o.multi_worker,
            "simulated": o.simulated,
            "description": o.help,
        }

    modes = {}
    for m in MODES.values():
        modes[m.name] = {
            "description": m.description,
            "strategy": m.strategy,
            "strategy_title": STRATEGY_TABLE[m.strategy].title,
            "speculation": m.speculation,
            "lookahead": m.lookahead,
            "dispatch": m.dispatch,
            "multi_worker": m.dispatch is not None,
            "tis_cap": m.tis_cap,
            "options": {name: option(o) for name, o in m.options().items()},
            "vllm_spec_options": {n: option(o) for n, o in vllm_spec_options().items()}
            if m.speculative
            else None,
            "simulator_note": m.simulator_note,
        }
    tasks = {
        name: {
            "options": {o.name: option(o) for o in options_of(cls.Options)},
            "run_options": RUN_TASK_OPTIONS[name],
        }
        for name, cls in TASKS.items()
    }
    return {"modes": modes, "dispatch": dispatch_doc(), "tasks": tasks}


def dispatch_doc() -> dict[str, Any]:
    """The dispatch policies (rollout/dispatch.py DISPATCH): description, options, and what migrate and
    order are when left to auto."""
    from reference_trainer.rollout.dispatch import DISPATCH, DispatchOptions, describe, policy_options

    return {
        name: {
            "description": describe(cls),
            "options": policy_options(cls),
            "auto_migrate": DispatchOptions(dispatch=name).migrates,
            "auto_order": DispatchOptions(dispatch=name).queue_order,
        }
        for name, cls in DISPATCH.items()
    }


def render_dispatch() -> str:
    """The dispatch policies as a section of their own."""
    out = [
        "DISPATCH POLICIES (--mode-option dispatch=NAME with --workers > 1, or package.module:Class;",
        "rlbench simulate --dispatch P1,P2 runs each mode under each)",
    ]
    for name, doc in dispatch_doc().items():
        opts = ", ".join(f"{k}={v}" for k, v in doc["options"].items()) or "none"
        auto = f"migrate auto = {'on' if doc['auto_migrate'] else 'off'}, order auto = {doc['auto_order']}"
        out += ["", *_wrap(name, doc["description"]), *_wrap("  options", f"{opts}; {auto}")]
    return "\n".join(out)


def _wrap(label: str, text: str) -> list[str]:
    lead = f"  {label}: "
    return textwrap.wrap(
        text, WIDTH, initial_indent=lead, subsequent_indent=" " * len(lead), break_on_hyphens=False
    )


def render_table() -> str:
    from reference_trainer.modes import MODES, STRATEGY_TABLE
    from reference_trainer.speculation.drafters import DRAFTERS, SPEC

    cols = ("MODE", "STRATEGY", "SPECULATION", "DISPATCH (W>1)", "OFF-POLICY CORRECTION")
    rows = [
        (
            m.name,
            STRATEGY_TABLE[m.strategy].title,
            (DRAFTERS[m.speculation].title if m.speculation else "none")
            + (" + lookahead" if m.lookahead and m.speculation != "lookahead" else ""),
            m.dispatch or "one engine only",
            f"TIS, cap {m.tis_cap:g}" if m.tis_cap is not None else "none",
        )
        for m in MODES.values()
    ]
    widths = [max(len(r[i]) for r in (cols, *rows)) + 2 for i in range(len(cols))]
    line = lambda r: "".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    out = [line(cols)]
    for m, row in zip(MODES.values(), rows, strict=True):
        opts = m.options()
        plain = [o for o in opts.values() if not o.name.startswith(f"{SPEC}.")]
        shown = [f"{o.name}={o.shown_default()}{' (W>1)' * o.multi_worker}" for o in plain]
        if m.speculative:
            shown.append(f"{SPEC}.* ({len(opts) - len(plain)} keys, below)")
        out += ["", line(row)]
        out += _wrap("what", m.description)
        out += _wrap("options", ", ".join(shown) or "none")
        out += _wrap("simulator", m.simulator_note)
    return "\n".join(out)


def render_options() -> str:
    """Every option once: type, default, the modes that take it, and whether the simulator models it."""
    from reference_trainer.modes import MODES
    from reference_trainer.speculation.drafters import vllm_spec_options

    takers: dict[str, list[str]] = {}
    options = {}
    defaults: dict[str, set[str]] = {}  # one option's defaults across modes: several are shown "per mode"
    for m in MODES.values():
        for name, o in m.options().items():
            takers.setdefault(name, []).append(m.name)
            options.setdefault(name, o)
            defaults.setdefault(name, set()).add(o.shown_default())
    out = ["OPTIONS (--mode-option KEY=VALUE on train, profile, compare and simulate)"]
    for name, o in options.items():
        low = f" >= {o.minimum:g}" if o.minimum is not None else ""
        kind = o.type + ("|null" if o.nullable else "") + low
        default = "per mode" if len(defaults[name]) > 1 else o.shown_default()
        sim = "simulated" if o.simulated else "trainer only"
        out += ["", f"{name}  [{kind}; default {default}; {sim}; modes: {', '.join(takers[name])}]"]
        out += _wrap("", o.help + (f" (choices: {', '.join(o.choices)})" if o.choices else ""))
    vllm = ", ".join(f"{o.name}={o.shown_default()}" for o in vllm_spec_options().values())
    vllm_line = f"With --engine vllm the spec keys are instead: {vllm}."
    out += ["", *textwrap.wrap(vllm_line, WIDTH, break_on_hyphens=False)]
    out += ["", *render_task_options()]
    return "\n".join(line.replace("  : ", "    ", 1) if line.startswith("  : ") else line for line in out)


def render_task_options() -> list[str]:
    """Each task's options (its record's fields), with the defaults an RL run overrides."""
    from reference_trainer.option import options_of
    from reference_trainer.tasks import RUN_TASK_OPTIONS, TASKS

    out = ["TASK OPTIONS (--task-option KEY=VALUE on train, profile and compare)"]
    for name, cls in TASKS.items():
        runs = ", ".join(f"{k}={v}" for k, v in RUN_TASK_OPTIONS[name].items())
        out += ["", f"{name}" + (f"  [RL runs: {runs}]" if runs else "")]
        for o in options_of(cls.Options):
            choices = f" (choices: {', '.join(o.choices)})" if o.choices else ""
            out += _wrap(o.name, f"{o.type}, default {o.shown_default()}: {o.help}{choices}")
    return out


def modes_command(
    json_out: Annotated[bool, typer.Option("--json", help="Print the registry as JSON.")] = False,
) -> None:
    """List the modes train/profile/compare/simulate accept: strategy, speculation, dispatch policy,
    off-policy correction, options with defaults, and how the simulator models each; then the dispatch
    policies."""
    if json_out:
        import json

        echo(json.dumps(registry_doc(), indent=2))
        return
    echo(render_table())
    echo("")
    echo(render_options())
    echo("")
    echo(render_dispatch())
