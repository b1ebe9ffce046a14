"""The READMEs and docs/ hold to the code: links and anchors resolve, every path, make target,
CLI command and setting they name exists, and the defaults and limits they quote are the
code's. A rename or a changed default fails here instead of leaving the docs wrong."""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
from pathlib import Path

import pytest

from engine.cli import build_parser
from engine.core import state
from engine.runtime.clients import consumer_config
from engine.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    ROOT / "engine" / "core" / "README.md",
    ROOT / "engine" / "wire" / "README.md",
    ROOT / "consumers" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
README = ROOT / "README.md"

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
# A repository path in backticks: at least one folder, a file name with an extension we keep.
PATH = re.compile(r"`((?:\.?[\w-]+/)+[\w.-]+\.(?:py|md|yaml|json|toml|avsc|xml|sh))`")
# Named in the docs but made by a build or a running broker, never committed.
GENERATED = {"engine/wire/avro_built.py"}
RUNTIME_FOLDERS = (".kafka/", ".registry/", "state/")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to -."""
    text = re.sub(r"`|\*\*|\*", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in HEADING.findall(FENCE.sub("", _text(path)))}


def _section(path: Path, title: str) -> str:
    text = _text(path)
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_anchor_resolves(doc: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", _text(doc))):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading with anchor #{anchor} in {linked.name}")
    assert not broken, f"{doc.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_named_exists(doc: Path) -> None:
    missing = []
    for name in set(PATH.findall(_text(doc))):
        candidates = [ROOT / name, doc.parent / name, ROOT / "tests" / name]
        if name in GENERATED or name.startswith(RUNTIME_FOLDERS):
            continue
        if not any(c.exists() for c in candidates):
            missing.append(name)
    assert not missing, f"{doc.relative_to(ROOT)} names files that do not exist: {missing}"


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", _text(ROOT / "Makefile"), re.M))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_make_target_named_exists(doc: Path) -> None:
    named = set(re.findall(r"\bmake ([a-z][\w-]*)", _text(doc)))
    if doc == README:
        assert {"run", "test", "demo", "bench", "setup"} <= named
    assert not named - _make_targets(), f"{doc.relative_to(ROOT)}: {named - _make_targets()}"


def _subcommands() -> set[str]:
    """Every subcommand of `reconciler`, nested ones as "topics create"."""
    found: set[str] = set()

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action._name_parser_map.items():
                    found.add(prefix + name)
                    walk(sub, f"{prefix}{name} ")

    walk(build_parser(), "")
    return found


def test_every_reconciler_command_named_exists() -> None:
    known = _subcommands()
    named = set()
    for doc in DOCS:
        for words in re.findall(r"`reconciler ([a-z]+(?: [a-z]+)?)", _text(doc)):
            first, _, second = words.partition(" ")
            named.add(f"{first} {second}" if f"{first} {second}" in known else first)
    assert {"run", "explain", "repair", "topics create"} <= named
    assert not named - known, f"documented commands the CLI lacks: {named - known}"


def _table_rows(section: str) -> dict[str, str]:
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = cells[1]
    return rows


def _shown(default: object) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, dict):
        return "empty"
    return f"`{default}`"


def test_the_configuration_table_is_the_settings_model() -> None:
    rows = _table_rows(_section(README, "Configuration"))
    fields = Settings.model_fields
    assert set(rows) == set(fields), (
        f"undocumented: {set(fields) - set(rows)}; not settings: {set(rows) - set(fields)}"
    )
    defaults = Settings().model_dump()
    for name, shown in rows.items():
        assert shown == _shown(defaults[name]), (
            f"{name}: README says {shown}, the code {defaults[name]!r}"
        )


def test_the_memory_section_quotes_the_defaults() -> None:
    quoted = re.findall(r"`([a-z0-9_]+)`[^`\[]*\[([\d,.]+)", _section(README, "Memory"))
    assert len(quoted) >= 6
    for name, value in quoted:
        default = Settings.model_fields[name].default
        assert float(value.replace(",", "")) == float(default), f"{name}: [{value}] vs {default}"


def test_the_timeouts_the_readme_quotes() -> None:
    text = _text(README)
    settings = Settings()
    assert f"`transaction_timeout_ms` ({settings.transaction_timeout_ms // 1000} s)" in text
    heartbeat = consumer_config(settings)["heartbeat.interval.ms"]
    assert heartbeat == settings.session_timeout_ms // 10
    assert "heartbeat (session_timeout_ms / 10)" in text
    assert f"default {settings.session_timeout_ms // 1000} s session" in text.replace("\n", " ")


def test_the_core_readme_quotes_the_core_limits() -> None:
    text = _text(ROOT / "engine" / "core" / "README.md")
    for name in ("LEASE_MS", "PARK_MS"):
        assert f"`{name}` = {getattr(state, name):,}" in text, name
    for name in ("PARKED_LIMIT", "PARKED_WRITES_LIMIT", "RECENT_EVENT_IDS"):
        assert f"`{name}` ({getattr(state, name)})" in text, name


def test_every_tool_the_docs_run_exists() -> None:
    missing = set()
    for doc in DOCS:
        text = _text(doc)
        for module in re.findall(r"python -m (tools\.\w+|engine\.\w+)", text):
            if not (ROOT / (module.replace(".", "/") + ".py")).exists():
                missing.add(module)
        for script in re.findall(r"\b((?:tools|examples)/[\w/]+\.py)\b", text):
            if not (ROOT / script).exists():
                missing.add(script)
    assert not missing, f"the docs run tools that do not exist: {missing}"


@pytest.mark.parametrize("package", ["engine/core", "consumers"])
def test_the_module_table_lists_every_module(package: str) -> None:
    text = _text(ROOT / package / "README.md")
    listed = {Path(m).name for m in re.findall(r"^\| `([\w/]+\.py)` \|", text, re.M)}
    modules = {
        p.relative_to(ROOT / package).as_posix()
        for p in (ROOT / package).rglob("*.py")
        if p.name != "__init__.py"
    }
    assert {Path(m).name for m in modules} == listed, f"{package}/README.md table vs the modules"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_test_file_named_exists(doc: Path) -> None:
    named = set(re.findall(r"\b(test_\w+\.py)\b", _text(doc)))
    present = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    assert not named - present, f"{doc.relative_to(ROOT)}: {named - present}"


@pytest.mark.parametrize("package", ["engine.core", "engine.wire"])
def test_every_function_the_invariants_name_exists(package: str) -> None:
    """`parked.drain`, `acks.awaits_rearm`, `codec.fields_of`: module and name both exist."""
    folder = ROOT / package.replace(".", "/")
    modules = {p.stem for p in folder.glob("*.py")}
    missing, checked = [], 0
    for module, name in re.findall(r"`(\w+)\.(\w+)`", _text(folder / "README.md")):
        if module in modules and name != "py":
            checked += 1
            loaded = importlib.import_module(f"{package}.{module}")
            if not hasattr(loaded, name):
                missing.append(f"{module}.{name}")
    assert checked >= 2
    assert not missing, f"{package}/README.md names what does not exist: {missing}"


def test_the_compiled_module_count_quoted_is_the_build() -> None:
    from engine.compiled import COMPILED

    quoted = re.findall(r"(\d+) (?:mypyc extensions|modules run as mypyc)", _text(README))
    assert quoted, "the README no longer says how many modules are compiled"
    assert {int(n) for n in quoted} == {len(COMPILED)}


@pytest.mark.parametrize("doc", [README, ROOT / "consumers" / "README.md"], ids=lambda p: p.name)
def test_the_integration_snippet_imports_what_exists(doc: Path) -> None:
    imports = re.findall(r"^from (consumers[\w.]*) import ([\w, ]+)$", _text(doc), re.M)
    for module, names in imports:
        loaded = importlib.import_module(module)
        for name in names.split(","):
            assert hasattr(loaded, name.strip()), f"{doc.name}: {module}.{name.strip()}"
    if doc == README:
        assert len(imports) == 2


def test_the_wire_readme_lists_every_decode_reason_and_state_version() -> None:
    from engine.wire.errors import DecodeReason
    from engine.wire.policy import POLICY, RecordType

    text = _text(ROOT / "engine" / "wire" / "README.md")
    listed = re.findall(
        r"\b([A-Z][A-Z_]+)\b",
        _section(ROOT / "engine/wire/README.md", "Reason codes (`DecodeReason`)"),
    )
    assert set(DecodeReason.__members__) <= set(listed)
    state = POLICY[RecordType.SESSION_STATE]
    versions = set(re.findall(r"^\| v(\d+) \|", text, re.M))
    assert versions == {str(v) for v in state.supported}
    assert re.search(rf"^\| v{state.current} \|.*\| this release \|$", text, re.M)


def test_the_runner_actions_table_is_action_of() -> None:
    from engine.core.decide import action_of
    from engine.core.events import Reason, Verdict

    section = _text(ROOT / "engine" / "core" / "README.md").split("## Runner actions", 1)[1]
    rows = re.findall(r"^\| ([A-Z_, ]+) \| ([\w, ]+) \| `(\w+)` \|", section, re.M)
    assert len(rows) == 6
    for verdicts, reasons, action in rows:
        named = list(Reason) if reasons == "any" else [Reason[r] for r in reasons.split(", ")]
        for verdict in verdicts.split(", "):
            for reason in named:
                got = action_of(Verdict[verdict], reason).name
                assert got == action, f"{verdict} {reason.name}: {got}, README {action}"


def _readme_acls() -> set[tuple[str, str, str, str, str]]:
    """The Security section's kafka-acls.sh commands, for-loops expanded, as tuples."""
    block = FENCE.findall(_section(README, "Security: SASL/SCRAM and ACLs"))[0]
    lines = [re.sub(r"\s+#.*$", "", ln) for ln in block.replace("\\\n", " ").splitlines()]
    commands: list[str] = []
    loop: list[str] | None = None
    for line in (ln.strip() for ln in lines):
        if match := re.match(r"for t in ([\w\- ]+); do$", line):
            loop = match.group(1).split()
        elif line == "done":
            loop = None
        elif line.startswith("kafka-acls.sh"):
            commands += [line.replace("$t", t) for t in loop] if loop else [line]
    found = set()
    for command in commands:
        words = command.split()
        arg = {words[i]: words[i + 1] for i in range(len(words) - 1) if words[i].startswith("--")}
        kind = next(k for k in ("--topic", "--group", "--transactional-id") if k in arg)
        operation = re.sub(r"(?<!^)([A-Z])", r"_\1", arg["--operation"]).upper()
        pattern = arg.get("--resource-pattern-type", "literal").upper()
        user = arg["--allow-principal"].removeprefix("User:")
        found.add((user, kind[2:].replace("-", "_").upper(), arg[kind], pattern, operation))
    return found


def _enum_name(value: object) -> str:
    return str(getattr(value, "name", value))


def test_the_security_acls_are_the_ones_the_secure_broker_gets() -> None:
    from tools.kafka_secure import acl_bindings

    granted = {
        (
            b.principal.removeprefix("User:"),
            _enum_name(b.restype),
            b.name,
            _enum_name(b.resource_pattern_type),
            _enum_name(b.operation),
        )
        for b in acl_bindings()
    }
    assert _readme_acls() == granted


def test_every_metric_and_stage_the_readme_names_exists() -> None:
    from engine.runtime.process.metrics import STAGES

    source = "".join(_text(p) for p in (ROOT / "engine").rglob("*.py"))
    registered = set(re.findall(r"\"(reconciler_\w+)\"", source))
    named = set(re.findall(r"\b(reconciler_\w+)", _text(README)))
    bare = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in named}
    assert len(bare) >= 5
    assert not bare - registered, f"metrics the README names that do not exist: {bare - registered}"
    documented = re.search(r"reconciler_stage_seconds\{stage=([\w|]+)\}", _text(README))
    assert documented is not None
    assert set(documented.group(1).split("|")) == set(STAGES)


def test_the_wire_readme_versions_table_is_the_policy() -> None:
    from engine.wire.policy import POLICY

    section = _section(ROOT / "engine" / "wire" / "README.md", "Current versions")
    rows = re.findall(r"^\| `(\w+)` \| v(\d+) \|\s*([v\d, ]*?)\s*\|$", section, re.M)
    table = {name: (int(current), set(re.findall(r"\d+", older))) for name, current, older in rows}
    policy = {
        kind.value: (p.current, {str(v) for v in p.supported if v != p.current})
        for kind, p in POLICY.items()
    }
    assert table == policy


# Repository text speaks of the project alone: no numbers of the team's own issues or working
# sessions, no lab notes, no names of tools that are not part of the project. Checked in every
# tracked text file: code, comments, docs, charts, tests.
INTERNAL = re.compile(
    # a working session's number; not a flag (`--sessions N`) or a count (`10k sessions 0.1 s`)
    r"(?<![-\w])sessions? \d+\b(?![.,]?\d)"
    # an issue's number, also "Issue N's goals"; another project's issue is cited by its link
    r"|\bissues? #?\d+"
    r"|\bclosing notes?\b"
    r"|\bfarm[-_ ]?(?:bench|studio)\b",
    re.I,
)
# Numbers that are not ours: another project's issue, allowed where its link is in the same file.
EXTERNAL_ISSUES = {
    "5456": "https://github.com/confluentinc/librdkafka/issues/5456",
    "5511": "https://github.com/confluentinc/librdkafka/issues/5511",
}


def internal_references(text: str) -> list[tuple[int, str]]:
    """(line, matched text) of every reference to the team's own work in `text`."""
    hits = []
    for match in INTERNAL.finditer(text):
        number = re.sub(r"\D", "", match.group())
        if number in EXTERNAL_ISSUES and EXTERNAL_ISSUES[number] in text:
            continue
        hits.append((text.count("\n", 0, match.start()) + 1, match.group()))
    return hits


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout
    return [ROOT / name for name in listed.decode().split("\0") if name]


def test_no_tracked_file_cites_our_own_issues_sessions_or_tools() -> None:
    found, scanned = [], 0
    for path in _tracked_text_files():
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        if "\0" in text:
            continue
        scanned += 1
        found += [f"{path.relative_to(ROOT)}:{n}: {hit}" for n, hit in internal_references(text)]
    assert scanned > 200
    assert found == [], "state these as facts about the code:\n" + "\n".join(found)


def test_the_internal_reference_pattern() -> None:
    # Digits and names joined at run time, so that this file cites nothing itself.
    n, farm, notes = "8", "farm", "closing " + "notes"
    for cited in [
        f"after session {n}'s merges",
        f"Sessions {n} to 9 ran on",
        f"## Open ends (issue {1}{n})",
        f"### Issue {1}{n}'s goals",
        f"a diagnostic for issue {1}{n}/12",
        f"librdkafka issue {9}{n}",  # another project's number without its link
        f"see the {notes}",
        f"paired runs with {farm}-bench",
        f"measured in {farm.title()} Studio",
    ]:
        assert internal_references(cited), cited
    for fine in [
        f'BENCH_ARGS="--sessions 1000{n}"',
        f"--restore-sessions 20000{n}",
        f"RECONCILER_SOAK_SESSIONS={n}",
        f"10k sessions {0}.{n} s, 100k 1.0 s",
        f"with sessions 10,00{n}",
        "librdkafka issue 5456 (https://github.com/confluentinc/librdkafka/issues/5456)",
        "a session id",
    ]:
        assert internal_references(fine) == [], fine
