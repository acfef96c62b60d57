"""The documentation is checked like code: README.md and docs/**/*.md.

- the README's Python example runs as written and trains a model that scores better than chance;
- docs/cli.md is exactly what ``ctrkit.cli_reference.render()`` generates from the parser, whatever the
  terminal width (regenerate with ``python -m ctrkit.cli_reference``);
- every relative link points to a file of the repository, and every ``#anchor`` to a heading;
- every ``ctrkit ...`` command of a shell block parses with the real parser, and a ``ctrkit train``
  command on a shipped config (``configs/...``) loads it with its ``--block.key=value`` overrides and
  passes the model's parameter check;
- every registered model has one docs/models section, whose parameter table lists each of its parameters,
  and is listed in the README's catalogue.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from ctrkit import cli_reference
from ctrkit.cli import build_parser
from ctrkit.models.registry import EMBEDDING_DEFAULTS, check_model_params, list_models, model_params
from ctrkit.training.config import load_config

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def fenced_blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, code, line of the opening fence) of every fenced code block."""
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def prose(text: str) -> str:
    """``text`` without fenced blocks and inline code (line count kept), where links and headings live."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return INLINE_CODE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(0)[1:-1], heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(FENCE.sub("", path.read_text(encoding="utf-8"))):
        s = slug(m.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


# ---- the README's Python example --------------------------------------------------------------------
def test_readme_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    blocks = [code for lang, code, _ in fenced_blocks(README.read_text(encoding="utf-8")) if lang == "python"]
    assert blocks, "README.md has no ```python block"
    for name in ("examples", "configs"):  # the example's relative paths, as from a source checkout
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(blocks[0], "README.md (python example)", "exec"), ns)  # noqa: S102 - the README's own example

    summary = ns["summary"]
    assert Path(summary["run_dir"], "best.pt").is_file()
    assert summary["run_dir"].startswith("runs")  # written under the working directory, not the repository
    assert summary["test"]["auc"] > 0.65, summary["test"]  # a constant scores 0.5; DeepFM learns the sample
    assert 0.3 < summary["test"]["logloss"] < 0.6, summary["test"]
    scores = ns["predictor"].predict([ns["row"]])  # an all-missing row scores too
    assert scores.shape == (1,) and np.isfinite(scores).all() and 0 < scores[0] < 1
    out = capsys.readouterr().out
    assert "'auc'" in out and "[" in out  # the prints ran
    assert f"'auc': {summary['test']['auc']}" in out.splitlines()[1]  # evaluate() gives the run's own test metrics
    assert "from ctrkit" not in blocks[0] and "import ctrkit\n" in blocks[0]  # the public names only


def test_import_ctrkit_exposes_the_users_verbs() -> None:
    import ctrkit

    for name in ctrkit.__all__:
        assert getattr(ctrkit, name) is not None, name
    for verb in ("preprocess_criteo", "preprocess_table", "preprocess_behaviour", "load_config", "train",
                 "evaluate", "Predictor", "create_model", "Schema", "CtrkitError", "ConfigError", "DataError"):
        assert verb in ctrkit.__all__, verb
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        ctrkit.trian  # noqa: B018


def test_readme_keeps_the_two_setup_commands() -> None:
    text = README.read_text(encoding="utf-8")
    setup = [code for lang, code, _ in fenced_blocks(text) if lang == "bash" and "make demo" in code]
    assert setup, "README.md lost its `make demo` / `make test` block"
    assert [ln.split("#")[0].strip() for ln in setup[0].strip().splitlines()] == ["make demo", "make test"]
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^demo:", makefile, re.MULTILINE) and re.search(r"^test:", makefile, re.MULTILINE)


# ---- the CLI reference ----------------------------------------------------------------------------------
def test_cli_reference_is_current() -> None:
    doc = DOCS / "cli.md"
    assert doc.is_file(), f"docs/cli.md is missing; generate it with `{cli_reference.REGENERATE}`"
    assert doc.read_text(encoding="utf-8") == cli_reference.render(), (
        f"docs/cli.md differs from the parser in src/ctrkit/cli.py; regenerate it with `{cli_reference.REGENERATE}`")


def test_cli_reference_ignores_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    narrow = cli_reference.render()
    monkeypatch.setenv("COLUMNS", "300")
    assert cli_reference.render() == narrow


def test_cli_reference_lists_every_command_and_option() -> None:
    text = cli_reference.render()
    commands = list(cli_reference.walk(build_parser()))
    assert len(commands) >= 10
    renamed = text.split("\n## Renamed options\n", 1)[1]
    for path, _, parser in commands:
        section = text.split(f"\n## ctrkit {' '.join(path)}\n", 1)
        assert len(section) == 2, f"no section for ctrkit {' '.join(path)}"
        body = section[1].split("\n## ", 1)[0]
        for action in parser._actions:
            if action.help is argparse.SUPPRESS:  # an old spelling: listed with its command under Renamed options
                assert f"| `ctrkit {' '.join(path)}` | `{action.option_strings[-1]}` |" in renamed, path
            elif action.option_strings and not isinstance(action, argparse._HelpAction):
                assert f"`{action.option_strings[-1]}`" in body, (path, action.option_strings)


def test_cli_module_docstring_names_every_command() -> None:
    from ctrkit import cli

    first = cli.__doc__.split("\n\n", 1)[0]
    named = set(re.findall(r"[a-z]+", first.split("``", 1)[1]))
    top = {path[0] for path, _, _ in cli_reference.walk(build_parser()) if len(path) == 1}
    assert top <= named, sorted(top - named)


def test_render_of_a_small_parser() -> None:
    p = argparse.ArgumentParser(prog="toy")
    sub = p.add_subparsers(dest="cmd")
    a = sub.add_parser("alpha", help="first command")
    a.add_argument("--size", type=int, default=7, help="how big (default %(default)s)")
    a.add_argument("--mode", choices=["x", "y"], default="x", help="a mode | <another>")
    a.add_argument("--flag", action="store_true", help="a switch")
    a.add_argument("--need", required=True)
    nest = sub.add_parser("nest", help="holds a leaf")
    leaf = nest.add_subparsers(dest="kind").add_parser("leaf", help="the leaf")
    leaf.add_argument("paths", nargs="+", help="files")
    text = cli_reference.render(p)
    # depth first, in registration order
    assert [h for h in re.findall(r"^## (.+)$", text, re.MULTILINE)] == ["toy", "toy alpha", "toy nest", "toy nest leaf"]
    assert "[`nest leaf`](#toy-nest-leaf)" in text
    assert "First command." in text
    assert "| `--size` | `7` | how big (default 7) |" in text
    assert "| `--mode` | `x` | a mode \\| &lt;another&gt; (one of `x`, `y`) |" in text
    assert "| `--flag` |  | a switch |" in text
    assert "| `--need` |  | required |" in text
    assert "| `paths` |  | files (one or more) |" in text
    assert "usage: toy nest leaf [-h] paths [paths ...]" in text


def test_cli_reference_check_mode(tmp_path: Path) -> None:
    out = tmp_path / "cli.md"
    assert cli_reference.main(["--check", "--out", str(out)]) == 1  # missing
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli_reference.main(["--out", str(out)]) == 0
    assert cli_reference.main(["--check", "--out", str(out)]) == 0
    out.write_text(out.read_text() + "edited by hand\n")
    assert cli_reference.main(["--check", "--out", str(out)]) == 1


# ---- links ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page: Path) -> None:
    text = prose(page.read_text(encoding="utf-8"))
    bad = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        line = text.count("\n", 0, m.start()) + 1
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if REPO not in dest.parents and dest != REPO:
            bad.append(f"line {line}: {target} leaves the repository")
        elif not dest.exists():
            bad.append(f"line {line}: {target} does not exist")
        elif anchor and (dest.is_dir() or dest.suffix != ".md"):
            bad.append(f"line {line}: {target} has an anchor but is not a Markdown file")
        elif anchor and anchor not in anchors(dest):
            bad.append(f"line {line}: {target}: no heading #{anchor} in {rel(dest)}")
    assert not bad, f"{rel(page)}:\n" + "\n".join(bad)


def test_the_pages_are_linked_from_the_index() -> None:
    index = prose((DOCS / "README.md").read_text(encoding="utf-8"))
    linked = {(DOCS / m.group(1).partition("#")[0]).resolve() for m in LINK.finditer(index)}
    models_index = prose((DOCS / "models" / "README.md").read_text(encoding="utf-8"))
    linked |= {(DOCS / "models" / m.group(1).partition("#")[0]).resolve() for m in LINK.finditer(models_index)}
    missing = [rel(p) for p in DOCS.rglob("*.md") if p.resolve() not in linked and p != DOCS / "README.md"]
    assert not missing, f"not linked from docs/README.md or docs/models/README.md: {missing}"


# ---- documented commands ----------------------------------------------------------------------------------
def documented_commands() -> list[tuple[str, int, list[str]]]:
    """(page, line, argv after 'ctrkit') of every ctrkit command in a bash / shell block of the docs."""
    out = []
    for page in PAGES:
        for lang, code, start in fenced_blocks(page.read_text(encoding="utf-8")):
            if lang not in ("bash", "sh", "shell", "console"):
                continue
            logical, first, heredoc = "", 0, None
            for i, line in enumerate(code.splitlines()):
                if heredoc is not None:  # the body of `cmd <<'EOF'`: not shell
                    heredoc = None if line.strip() == heredoc else heredoc
                    continue
                if m := re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line):
                    heredoc = m.group(1)
                if not logical:
                    first = start + 1 + i
                logical += line
                if logical.rstrip().endswith("\\"):
                    logical = logical.rstrip()[:-1] + " "
                    continue
                words = shlex.split(logical, comments=True)
                logical = ""
                if words and words[-1] == "&":
                    words = words[:-1]
                if words and words[0] == "ctrkit":
                    out.append((rel(page), first, words[1:]))
    return out


COMMANDS = documented_commands()


def test_the_docs_show_commands() -> None:
    shown = {argv[0] for _, _, argv in COMMANDS if argv}
    assert {"preprocess", "train", "evaluate", "predict", "export", "serve"} <= shown, shown


@pytest.mark.parametrize(("page", "line", "argv"), COMMANDS,
                         ids=[f"{p}:{n}:{' '.join(a[:2])}" for p, n, a in COMMANDS])
def test_documented_command_parses(page: str, line: int, argv: list[str]) -> None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args, extra = build_parser().parse_known_args(argv)
    except SystemExit:
        pytest.fail(f"{page}:{line}: `ctrkit {' '.join(argv)}` does not parse: {err.getvalue().strip()}")
    if args.command != "train":
        assert not extra, f"{page}:{line}: unrecognized arguments {extra}"
        return
    if not args.config.startswith("configs/"):  # a config the page writes itself (shown in a yaml block)
        return
    cfg = load_config(REPO / args.config, extra)  # the shipped config exists, the overrides are valid keys and values
    check_model_params(cfg.model.name, cfg.model.params)


# ---- models --------------------------------------------------------------------------------------------------
def model_sections() -> dict[str, str]:
    """'## ...' heading -> its text, over every page of docs/models; a page's '# ...' title -> the whole page
    (a page about one model, e.g. dlrm.md)."""
    out = {}
    for page in sorted((DOCS / "models").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        title = re.match(r"# (.+)", text)
        if title:
            out[f"{page.name}: {title.group(1)}"] = text
        for part in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
            heading, _, body = part.partition("\n")
            out[f"{page.name}: {heading}"] = body
    return out


@pytest.mark.parametrize("name", list_models())
def test_every_model_and_parameter_is_documented(name: str) -> None:
    sections = {h: body for h, body in model_sections().items() if f"`{name}`" in h.split(": ", 1)[1]}
    assert len(sections) == 1, f"model {name!r}: want one docs/models section headed with `{name}`, got {list(sections)}"
    (heading, body), = sections.items()
    first_cells = " ".join(line.split("|")[1] for line in body.splitlines() if line.startswith("| "))
    own = [p for p in model_params(name) if p not in EMBEDDING_DEFAULTS]  # those every model takes: the index
    missing = [p for p in own if f"`{p}`" not in first_cells]
    assert not missing, f"{heading}: parameters of {name!r} missing from its parameter table: {missing}"
    assert "configs/" in body, f"{heading}: names no config"


def test_the_options_every_model_takes_are_documented_once() -> None:
    index = (DOCS / "models" / "README.md").read_text()
    first_cells = " ".join(line.split("|")[1] for line in index.splitlines() if line.startswith("| "))
    assert not [p for p in EMBEDDING_DEFAULTS if f"`{p}`" not in first_cells]


def test_readme_catalogue_lists_every_model() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [name for name in list_models() if f"| `{name}` |" not in text]
    assert not missing, f"README.md's model catalogue lacks {missing}"
