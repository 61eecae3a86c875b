"""Record today's code in dvc.lock / analysis/dvc.lock without the outputs at hand: each stage's code deps (stage
modules, medrank/ folders: `tests.helpers.deps`'s lists) get DVC's own hash and size of today's files, and nothing
else in the locks changes.

`dvc commit -f` does this and more, but it needs every output in the workspace; a checkout without the DVC cache
(a fresh clone, a machine of another CPU kind whose outputs differ) has none. Use it only for a change that cannot
move an output (a refactor, an unused path); a change that can is a re-run of the stage.

    python -m tests.helpers.relock_code medrank/encoders stages/embed.py   # rewrite these deps where stale, print each
    python -m tests.helpers.relock_code --check                            # exit 1 if any code dep is stale
    python -m tests.helpers.relock_code --params nested_loso mtl_ablations # these stages' params values: today's

`--params` is for a params change that cannot move the named stages' outputs (a key moved to its one owner, its value
the same; a key the stage declares but whose outputs are independent of it): it records today's params.yaml values of
each named stage's declared params, as `dvc commit -f` would, and nothing else.

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


def relock_params(names: list[str], dvc_files: tuple[str, ...] = DVC_FILES, root=REPO) -> list[str]:
    """Rewrite the locked params values of the stages `names` to today's (DVC's own reading and serialisation);
    the lock lines of each rewritten stage, printed."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo
    from dvc.stage.serialize import _serialize_params_values
    from dvc.utils.serialize import dump_yaml, parse_yaml_for_update

    repo = Repo(str(root))
    done: list[str] = []
    for dvc_file in dvc_files:
        lock_path = root / dvc_file.replace("dvc.yaml", "dvc.lock")
        lock = parse_yaml_for_update(lock_path.read_text(), str(lock_path))
        changed = False
        for stage in repo.index.stages:
            if stage.path != str(root / dvc_file) or stage.name not in names or stage.name not in lock["stages"]:
                continue
            params = [d for d in stage.deps if isinstance(d, ParamsDependency)]
            for dep in params:
                dep.save()
            lock["stages"][stage.name]["params"] = _serialize_params_values(params)
            changed = True
            done.append(f"{lock_path.name}: {stage.name}")
        if changed:
            dump_yaml(str(lock_path), lock)
    missing = sorted(set(names) - {d.split(": ")[1] for d in done})
    if missing:
        raise SystemExit(f"no locked stage named {', '.join(missing)}")
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help="the code deps to rewrite (default with --check: every one)")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--params", nargs="+", metavar="STAGE", help="record today's params values of these stages")
    args = ap.parse_args()
    if args.params:
        for line in relock_params(args.params):
            print(f"{line}: params recorded")
        return
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
