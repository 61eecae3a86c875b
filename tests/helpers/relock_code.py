"""Record today's code in dvc.lock / analysis/dvc.lock without the outputs at hand: each stage's code deps (stage
modules, medrank/ folders: `tests.helpers.deps`'s lists) get DVC's own hash and size of today's files, and nothing
else in the locks changes.

`dvc commit -f` does this and more, but it needs every output in the workspace; a checkout without the DVC cache
(a fresh clone, a machine of another CPU kind whose outputs differ) has none. Use it only for a change that cannot
move an output (a refactor, an unused path); a change that can is a re-run of the stage.

    python -m tests.helpers.relock_code medrank/encoders stages/embed.py   # rewrite these deps where stale, print each
    python -m tests.helpers.relock_code --check                            # exit 1 if any code dep is stale

Name the paths your change touched: a dep left stale by an earlier change (a stage that should have re-run) stays so.
"""

from __future__ import annotations

import argparse
import re
import sys

import yaml

from tests.helpers.deps import DVC_FILES, REPO, is_code


def stale_code_deps(
    only: list[str] | None = None, dvc_files: tuple[str, ...] = DVC_FILES
) -> dict[str, dict[str, list[tuple[dict, dict]]]]:
    """{lock file: {stage: [(locked entry, today's entry)]}} for the code deps (of `only`, if given) whose hash
    differs."""
    from dvc.repo import Repo

    repo = Repo(str(REPO))
    out: dict = {}
    for dvc_file in dvc_files:
        lock_path = REPO / dvc_file.replace("dvc.yaml", "dvc.lock")
        locked = (yaml.safe_load(lock_path.read_text()) or {}).get("stages", {})
        for stage in repo.index.stages:
            if stage.path != str(REPO / dvc_file) or stage.name not in locked:
                continue
            entries = {d["path"]: d for d in locked[stage.name].get("deps", [])}
            for dep in stage.deps:
                entry = entries.get(dep.def_path)
                if entry is None or not is_code(dep.def_path) or (only and dep.def_path.rstrip("/") not in only):
                    continue
                meta, hash_info = dep._get_hash_meta()
                now = {"md5": hash_info.value, "size": meta.size, **({"nfiles": meta.nfiles} if meta.isdir else {})}
                if any(entry.get(k) != v for k, v in now.items()):
                    out.setdefault(str(lock_path), {}).setdefault(stage.name, []).append((entry, now))
    return out


def rewrite(lock_path: str, stages: dict[str, list[tuple[dict, dict]]]) -> None:
    """Replace each stale entry's lines inside its stage's block of the lock's text (the file's layout kept)."""
    from medrank.core.io import write_text

    text = open(lock_path).read()
    for name, changes in stages.items():
        head = re.search(rf"^  {re.escape(name)}:\n", text, re.M)
        if head is None:
            raise SystemExit(f"{lock_path}: no stage '{name}' to rewrite")
        start = head.end()
        end = re.search(r"^  \S", text[start:], re.M)
        stop = start + end.start() if end else len(text)
        block = text[start:stop]
        for entry, now in changes:
            old = re.search(rf"^    - path: {re.escape(entry['path'])}\n((?:      .*\n)*)", block, re.M)
            body = old[1]
            for key, value in now.items():
                body = re.sub(rf"^      {key}: .*$", f"      {key}: {value}", body, flags=re.M)
            block = block[: old.start(1)] + body + block[old.end(1) :]
        text = text[:start] + block + text[stop:]
    write_text(lock_path, text)  # temp file, then rename


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help="the code deps to rewrite (default with --check: every one)")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if not args.paths and not args.check:
        ap.error("name the code deps your change touched (or --check)")
    stale = stale_code_deps([p.rstrip("/") for p in args.paths] or None)
    for lock_path, stages in stale.items():
        for name, changes in stages.items():
            for entry, now in changes:
                print(f"{lock_path}: {name}: {entry['path']} {entry['md5']} -> {now['md5']}")
        if not args.check:
            rewrite(lock_path, stages)
    sys.exit(1 if stale and args.check else 0)


if __name__ == "__main__":
    main()
