"""params.yaml as a whole: the Params model, `load_params` (every key validated, one error line naming it), and the
inference recipe `medrank rank` reads back from models/system.json."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from medrank.core.errors import MedrankError
from medrank.core.io import read_text_capped
from medrank.params.base import MAX_COUNT, MAX_STEPS, _Section
from medrank.params.pipeline import (
    AcquireParams,
    ChiqaParams,
    CleanParams,
    CnnParams,
    EmbedParams,
    FinetuneParams,
    NormalizeParams,
    RetrieveParams,
)
from medrank.params.groups import ANALYSIS_GROUPS, BIENC_GROUPS, RETRIEVAL_GROUPS, STACKED_GROUPS
from medrank.params.rankers import (
    DEFAULT_ENCODER,
    ENCODER_SECTIONS,
    AgreeParams,
    AnalysisParams,
    BaselineParams,
    BiencParams,
    EncoderParams,
    MODEL_KEEP,
    MODEL_KEEP_FIELDS,
    MtlParams,
    PassagesParams,
    NoiseBandParams,
    QaBiencParams,
    QaGradedParams,
    QaParams,
    ScoreParams,
    Task2Params,
    default_encoders,
    mtl_rows,
    nested_recipes,
)


MAX_PARAMS_BYTES = 2**20  # the repository's params.yaml is ~25 KB
# mappings and lists inside one another, aliases expanded; the repository's params.yaml is 7 deep (the top-level mapping,
# analysis, nested, variants, a variant, its baseline, features); PyYAML's composer recurses, out of stack at ~500
MAX_PARAMS_DEPTH = 32
# the sections whose cv_folds is the top-level key (Params._one_cv_folds): params.yaml spells it once, at top level
FOLDS_OF = ("baseline", "mtl", "score")
# the sections whose decision keys (MODEL_KEEP_FIELDS) score.keep_rules[0] sets (Params._one_keep_rule): the models' own
# submissions and held-out decisions keep answers by the final system's first rule, and params.yaml spells it once
KEEP_OF = ("baseline", "mtl")


class Params(_Section):
    seed: int = Field(default=13, ge=0, le=2**32 - 1)  # numpy's seed range
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    n_candidates: int = Field(default=3, ge=1, le=50)
    rqe_threshold: float | None = Field(default=0.5, ge=0.0, le=1.0)
    # the first questions of each split by (split, qid), the same for every stage (tiny profiles cap it); None = all
    max_questions_per_split: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    # the question-grouped CV folds over train+val, one value for the baseline, the MTL and the final system (which
    # pairs both models' out-of-fold rows fold by fold): each section's cv_folds is this key, filled in (FOLDS_OF)
    cv_folds: int = Field(default=5, ge=2, le=MAX_STEPS)
    # one section per stage, in DAG order (params.yaml spells out every key: see load_params)
    acquire: AcquireParams = AcquireParams()
    clean: CleanParams = CleanParams()
    normalize: NormalizeParams = NormalizeParams()
    chiqa: ChiqaParams = ChiqaParams()
    finetune: FinetuneParams = FinetuneParams()  # finetune_nli, finetune_rqe
    cnn: CnnParams = CnnParams()  # cnn_data ... cnn_mediqa
    retrieve: RetrieveParams = RetrieveParams()
    embed: EmbedParams = EmbedParams()
    # the zero-shot sentence encoders by name; bienc, passages and agree each name the one they read (ENCODER_SECTIONS)
    encoders: dict[str, EncoderParams] = Field(default_factory=default_encoders, min_length=1)
    bienc: BiencParams = BiencParams()
    passages: PassagesParams = PassagesParams()
    agree: AgreeParams = AgreeParams()  # analysis/dvc.yaml
    qa: QaParams = QaParams()  # analysis/dvc.yaml
    qa_graded: QaGradedParams = QaGradedParams()  # analysis/dvc.yaml
    qa_bienc: QaBiencParams = QaBiencParams()  # analysis/dvc.yaml
    baseline: BaselineParams = BaselineParams()
    mtl: MtlParams = MtlParams()
    noise_band: NoiseBandParams = NoiseBandParams()  # frozen stage noise_band: the written rule's tolerance
    task2: Task2Params = Task2Params()
    score: ScoreParams = ScoreParams()
    analysis: AnalysisParams = (
        AnalysisParams()
    )  # analysis/dvc.yaml: rqe_selection, baseline_ablations, mtl_ablations, mtl_confirm

    @model_validator(mode="before")
    @classmethod
    def _one_cv_folds(cls, data: Any) -> Any:
        """The top-level cv_folds into each section of FOLDS_OF (load_params refuses a params file whose section
        spells its own; a dumped Params holds both, the same)."""
        if not isinstance(data, dict) or "cv_folds" not in data:
            return data
        data = dict(data)
        for section in FOLDS_OF:
            raw = data.get(section, {})
            if isinstance(raw, dict):
                data[section] = {**raw, "cv_folds": data["cv_folds"]}
        return data

    @model_validator(mode="before")
    @classmethod
    def _one_keep_rule(cls, data: Any) -> Any:
        """score.keep_rules[0]'s decision keys (MODEL_KEEP) into each section of KEEP_OF (load_params refuses a params
        file whose section spells one; a dumped Params holds them, the same)."""
        if not isinstance(data, dict) or not isinstance(data.get("score"), dict):
            return data
        rules = data["score"].get("keep_rules")
        if not isinstance(rules, list) or not rules or not isinstance(rules[0], str):
            return data  # the score section's own validation names it
        if rules[0] not in MODEL_KEEP:
            raise ValueError(
                f"score.keep_rules[0]: {rules[0]!r} cannot come first: the first rule also decides the baseline's and the "
                f"MTL's own rows inside their fits, which can apply only {', '.join(MODEL_KEEP)} (list one of them first)"
            )
        data = dict(data)
        for section in KEEP_OF:
            raw = data.get(section, {})
            if isinstance(raw, dict):
                data[section] = {**raw, **MODEL_KEEP[rules[0]]}
        return data

    def encoder_of(self, section: str) -> EncoderParams:
        """The encoder that `section` (one of ENCODER_SECTIONS) names in the encoders table."""
        return self.encoders[getattr(self, section).encoder]

    @model_validator(mode="after")
    def _check_rows(self) -> "Params":
        for section in ENCODER_SECTIONS:
            name = getattr(self, section).encoder
            if name not in self.encoders:
                raise ValueError(
                    f"{section}.encoder: {name!r} is not in the encoders table (one of {', '.join(self.encoders)})"
                )
        for key, groups in (
            ("baseline.features", self.baseline.features),
            ("mtl.feature_groups", self.mtl.feature_groups),
        ):
            for g in groups:
                if g in ANALYSIS_GROUPS:
                    raise ValueError(
                        f"{key}: group {g} is computed by analysis/dvc.yaml (stage {g}), which `dvc repro` does not run; "
                        f"use it in analysis rows, or move stage {g} into dvc.yaml and its output into this stage's deps to adopt it"
                    )
        for g in (g for g in self.baseline.features if g in RETRIEVAL_GROUPS):
            raise ValueError(
                f"baseline.features: group {g} reads the entailed MedQuAD answers of stage retrieve, an analysis/dvc.yaml "
                "stage since system_choice picked the baseline (the default DAG trains no MTL); use it in analysis rows"
            )
        recipes = nested_recipes(self.baseline, self.mtl, self.analysis.nested.variants)
        # a stacked group is computed inside the nested refits' MTL fits (Refits.systems) and nowhere else
        where = {
            "baseline.features": self.baseline.features,
            "mtl.feature_groups": self.mtl.feature_groups,
            **{f"analysis.baseline.rows[{i}]": row for i, row in enumerate(self.analysis.baseline.rows)},
            **{f"analysis.mtl.rows[{i}]": r.get("feature_groups", []) for i, r in enumerate(self.analysis.mtl.rows)},
            **{f"analysis.nested.variants ({n}).baseline.features": bp.features for n, (bp, _) in recipes.items()},
        }
        for key, groups in where.items():
            for g in (g for g in groups if g in STACKED_GROUPS):
                raise ValueError(
                    f"{key}: group {g} is the baseline's held-out scores fed to the MTL, computed inside nested_loso's "
                    "refits only: use it in an analysis.nested.variants row's mtl.feature_groups"
                )
        lacking = [g for g in self.baseline.features if g in BIENC_GROUPS]
        if self.baseline.judged_rows != "none" and lacking and not self.bienc.judged:
            raise ValueError(
                f"baseline.judged_rows: {self.baseline.judged_rows!r} trains on the judged LiveQA answers, whose {lacking[0]} "
                "scores stage bienc writes only with bienc.judged: true"
            )
        rows = mtl_rows(self.mtl, self.analysis.mtl.rows)
        for i, name in enumerate(
            self.analysis.confirm.mtl_rows if rows else []
        ):  # no rows (e.g. the key deleted): load_params names it
            if name not in rows:
                raise ValueError(
                    f"analysis.confirm.mtl_rows[{i}]: {name!r} is not a row name of analysis.mtl.rows ({', '.join(rows) or 'none'})"
                )
        return self


def _entry_section(ann: object) -> type[_Section] | None:
    """X of a `dict[str, X]` field whose entries are sections (the encoders table), else None."""
    args = get_args(ann)
    if get_origin(ann) is dict and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], _Section):
        return args[1]
    return None


class _Entries:
    """A table of sections under a field, while `_key` walks an error location (the next element is an entry's name)."""

    model_fields: dict = {}

    def __init__(self, section: type[_Section]):
        self.section = section


def _key(loc: tuple) -> str:
    """The params key of a Params error location, without pydantic's union-member tags (`threads.constrained-int`)."""
    model: Any = Params
    parts: list[str] = []
    for el in loc:
        if isinstance(el, int):
            parts.append(str(el))
        elif model is not None and el in model.model_fields:
            parts.append(el)
            ann = model.model_fields[el].annotation
            model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
            if model is None and (entry := _entry_section(ann)) is not None:  # e.g. encoders.<name>.<field>
                model = _Entries(entry)
        elif isinstance(model, _Entries):  # the table's key, as written
            parts.append(str(el))
            model = model.section
        elif model is not None:  # an unknown key: named as written
            parts.append(str(el))
    return ".".join(parts) or "<root>"


def _format_error(path: Path, err: ValidationError) -> str:
    first = err.errors()[0]
    key = _key(first["loc"])
    if first["type"] == "extra_forbidden":
        return f"{path}: unknown key '{key}'"
    got = first.get("input")
    got_s = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
    more = f" [+{len(err.errors()) - 1} more]" if len(err.errors()) > 1 else ""
    if key == "<root>":  # a check across sections (Params._check_rows): its message names the key
        return f"{path}: {first['msg'].removeprefix('Value error, ')}{more}"
    return f"{path}: {key}: {first['msg']}{got_s}{more}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a mapping with a repeated key (YAML allows it, the last silently wins; DVC refuses)."""

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.MarkedYAMLError(problem=f"duplicate key {key!r}", problem_mark=key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2 (DVC's reader) reads `1e-4`, `1E5` and `2.5e3` as floats; PyYAML's YAML 1.1 resolver wants a dot and a signed
# exponent, and reads them as strings (`mtl.lr: 1e-4` was refused as "not a valid number"). Quoted, they stay strings.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def _check_depth(path: Path, events) -> None:
    """Refuse nesting deeper than MAX_PARAMS_DEPTH from the parser's events (a state machine: it does not recurse), aliases
    counted at the depth of what they stand for, before any reader builds the tree recursively."""
    heights: dict[str, int] = {}  # anchor: levels of the mapping / list it names
    stack: list[list] = []  # per open mapping / list: [its anchor, the levels of its deepest child]
    for ev in events:
        if isinstance(ev, yaml.CollectionStartEvent):
            stack.append([ev.anchor, 0])
            depth = len(stack)
        elif isinstance(ev, yaml.CollectionEndEvent):
            anchor, below = stack.pop()
            if anchor is not None:
                heights[anchor] = below + 1
            if stack:
                stack[-1][1] = max(stack[-1][1], below + 1)
            continue
        elif isinstance(ev, yaml.AliasEvent):  # anchors, each a list of the one before, nest without indenting
            depth = len(stack) + heights.get(ev.anchor, 0)
            if stack:
                stack[-1][1] = max(stack[-1][1], heights.get(ev.anchor, 0))
        else:
            continue
        if depth > MAX_PARAMS_DEPTH:
            raise MedrankError(
                f"{path}: line {ev.start_mark.line + 1}: mappings and lists nested more than {MAX_PARAMS_DEPTH} deep "
                "(the repository's params.yaml: 7)"
            )


def _same(a: object, b: object, at: tuple, seen: set) -> tuple | None:
    """The first place where two readings of a file differ, type included (True is not 1): (key path, a's, b's, whether
    it is a key); None where they agree. A subtree shared through an alias is compared once."""
    if (id(a), id(b)) in seen:
        return None
    seen.add((id(a), id(b)))
    if type(a) is not type(b):
        return at, a, b, False
    if isinstance(a, dict):
        keys_a, keys_b = {(type(k), k) for k in a}, {(type(k), k) for k in b}
        only_a, only_b = [k for k in a if (type(k), k) not in keys_b], [k for k in b if (type(k), k) not in keys_a]
        if only_a or only_b:  # `on:` is the key True to YAML 1.1
            return at, only_a[:1], only_b[:1], True
        return next((d for k in a if (d := _same(a[k], b[k], (*at, k), seen))), None)
    if isinstance(a, list):
        if len(a) != len(b):
            return at, a, b, False
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := _same(x, y, (*at, i), seen))), None)
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return None  # `.nan` both ways (refused anyway: allow_inf_nan=False)
    return None if a == b else (at, a, b, False)


def _spell(value: object) -> str:
    """`value` as YAML that every reader reads the same (a string double-quoted)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ("-.inf" if value < 0 else ".inf")
    if isinstance(value, float) and "." not in repr(value):
        return repr(value).replace("e", ".0e")  # 1e-05: YAML 1.1 wants the dot
    return json.dumps(value) if isinstance(value, (bool, int, float, type(None))) else repr(value)


def _as_dvc_reads(path: Path, text: str, raw: object) -> None:
    """Refuse a value that YAML 1.1 (PyYAML: this loader, the reports) and YAML 1.2 (ruamel.yaml, as DVC parses params
    files: dvc/utils/serialize/_yaml.py) read differently, e.g. `010`, `no`, `1:30`: one line naming the key."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        dvc = YAML(typ="safe").load(text)  # DVC's parse_yaml, the same call
    except YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise MedrankError(f"{path}:{where} not valid YAML as DVC reads it ({problem})") from None
    diff = _same(raw, dvc, (), set())
    if diff is None:
        return
    at, mine, theirs, is_key = diff
    key = ".".join(map(str, at)) or "<top level>"
    if is_key:  # the first key each side has and the other lacks
        t, m = (_spell(k[0]) if k else "(none)" for k in (theirs, mine))
        ways = " or ".join(_spell(k) for k in theirs + mine)
        raise MedrankError(
            f"{path}: {key}: DVC (YAML 1.2) reads a key {t}, YAML 1.1 readers {m}; write {ways} so both read the same"
        )
    ways = " or ".join(dict.fromkeys(_spell(v) for v in (theirs, mine)))
    raise MedrankError(
        f"{path}: {key}: DVC (YAML 1.2) reads {_spell(theirs)}, YAML 1.1 readers {_spell(mine)}; "
        f"write {ways} so both read the same"
    )


def _missing_keys(model: type[BaseModel], raw: dict, prefix: str = "") -> list[str]:
    """Dotted keys of `model` (sections recursed) that `raw` does not spell out."""
    out = []
    for name, field in model.model_fields.items():
        if name == "cv_folds" and prefix.rstrip(".") in FOLDS_OF:  # filled in from the top-level key
            continue
        if name in MODEL_KEEP_FIELDS and prefix.rstrip(".") in KEEP_OF:  # filled in from score.keep_rules[0]
            continue
        if name not in raw:
            out.append(prefix + name)
        elif (
            isinstance(field.annotation, type)
            and issubclass(field.annotation, _Section)
            and isinstance(raw[name], dict)
        ):
            out += _missing_keys(field.annotation, raw[name], f"{prefix}{name}.")
        elif (entry := _entry_section(field.annotation)) is not None and isinstance(raw[name], dict):
            for key, value in raw[name].items():  # each entry of a table of sections spells out every key
                if isinstance(value, dict):
                    out += _missing_keys(entry, value, f"{prefix}{name}.{key}.")
    return out


def load_params(path: str | Path = "params.yaml") -> Params:
    """Load and validate the whole params file: every key present (DVC refuses a file without a key a stage declares,
    and a default hidden in code is a knob no experiment records), none unknown, none repeated, types strict."""
    path = Path(path)
    if not path.exists():
        raise MedrankError(f"{path}: params file not found")
    try:  # size-checked before it is read (a link to /dev/zero, a dump): one line, never an unbounded read
        text = read_text_capped(path, MAX_PARAMS_BYTES, "a params file")
    except OSError as e:  # a folder, no permission
        raise MedrankError(f"{path}: cannot be read as a params file ({e.strerror or e})") from None
    for n, line in enumerate(text.splitlines(), start=1):  # an unresolved merge: named, not "not valid YAML"
        if re.match(r"(?:<{7}|={7}|>{7})(?: |$)", line):
            raise MedrankError(
                f"{path}: line {n}: a merge conflict marker ({line.split()[0]}); resolve the conflict first"
            )
    try:
        _check_depth(path, yaml.parse(text, Loader=yaml.SafeLoader))
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None)
        raise MedrankError(f"{path}:{where} not valid YAML" + (f" ({problem})" if problem else "")) from None
    if raw is None:
        raise MedrankError(f"{path}: empty (expected a mapping of sections, e.g. the repository's params.yaml)")
    if not isinstance(raw, dict):
        raise MedrankError(f"{path}: expected a mapping of sections at top level")
    _as_dvc_reads(path, text, raw)
    for section in FOLDS_OF:  # one owner: the top-level key (Params._one_cv_folds fills each section in)
        if isinstance(raw.get(section), dict) and "cv_folds" in raw[section]:
            raise MedrankError(
                f"{path}: {section}.cv_folds: the CV folds are the top-level cv_folds (one value for "
                f"{', '.join(FOLDS_OF)}: the final system pairs both models' out-of-fold rows fold by fold)"
            )
    for section in KEEP_OF:  # one owner: score.keep_rules[0] (Params._one_keep_rule fills each section in)
        spelled = [k for k in MODEL_KEEP_FIELDS if isinstance(raw.get(section), dict) and k in raw[section]]
        if spelled:
            raise MedrankError(
                f"{path}: {section}.{spelled[0]}: the keep decision is score.keep_rules[0]'s (one rule keeps the final "
                f"system's answers and {', '.join(KEEP_OF)}'s own: their {', '.join(MODEL_KEEP_FIELDS)} follow it)"
            )
    try:
        params = Params.model_validate(raw)
    except ValidationError as e:
        raise MedrankError(_format_error(path, e)) from None
    missing = _missing_keys(Params, raw)
    if missing:
        more = f" [+{len(missing) - 1} more]" if len(missing) > 1 else ""
        raise MedrankError(
            f"{path}: missing key '{missing[0]}'{more} (params.yaml spells out every key, as DVC reads it)"
        )
    return params


# what `medrank rank` needs to treat a new question exactly as the stages treated the test questions: each step of the
# inference path is saved by the stage that runs it (medrank.steps), with the params keys it read (a dotted key: one
# field of a section); the saved steps together are the recipe `recipe_params` rebuilds
STEP_PARAMS: dict[str, tuple[str, tuple[str, ...]]] = {  # step: (the stage that saves it, its params keys)
    "normalize": ("normalize", ("normalize",)),
    "retrieve": ("retrieve", ("n_candidates", "rqe_threshold", "retrieve")),
    "grids": ("embed", ("embed",)),
    "answer_scores": ("bienc", ("seed", "bienc")),  # seed: the question-type classifier of group qtype
    "passages": ("passages", ("passages",)),  # group passage: its encoder over the answer's windows
    "cnn_scores": ("cnn_mediqa", ("cnn.mediqa_aggregation",)),
}

# where an extraction pass runs (here, forked workers, a Ray pool), not what it computes: the outputs are the same either way
_PLACEMENT = {"retrieve": {"backend", "workers", "ray"}, "embed": {"backend", "workers", "ray"}}


def step_params(p: Params, step: str) -> dict:
    """The params keys of `step` (STEP_PARAMS) as a nested dict, less where extraction runs; a section that names an
    encoder is recorded with that encoder's fields in place of its name (the values the step ran with: a recipe
    depends on no name of the encoders table, and renaming an entry changes no saved step)."""
    out: dict = {}
    for key in STEP_PARAMS[step][1]:
        section, _, field = key.partition(".")
        value = p.model_dump(mode="json", include={section}, exclude=_PLACEMENT)[section]
        if section in ENCODER_SECTIONS and not field:
            value = {
                **{k: v for k, v in value.items() if k != "encoder"},
                **p.encoder_of(section).model_dump(mode="json"),
            }
        out[section] = {field: value[field]} if field else value
    return out


def _tabled(recipe: dict) -> dict:
    """A saved recipe's sections with their encoder in place (step_params) as the encoders table: one entry per distinct
    encoder (two sections with the same one share it, and a scorer loads it once), each section naming its entry; a
    section without encoder fields names the default entry (a step saved before the table: passages read bienc's)."""
    fields = set(EncoderParams.model_fields)
    recipe, table = dict(recipe), dict(recipe.get("encoders") or {})
    for section in ENCODER_SECTIONS:
        value = recipe.get(section)
        if not isinstance(value, dict) or not fields & set(value):
            continue
        encoder = {k: v for k, v in value.items() if k in fields}
        name = next((n for n, e in table.items() if e == encoder), None)
        if name is None:
            name = DEFAULT_ENCODER if DEFAULT_ENCODER not in table else section
            table[name] = encoder
        recipe[section] = {**{k: v for k, v in value.items() if k not in fields}, "encoder": name}
    if table:
        recipe["encoders"] = table
    return recipe


def recipe_params(recipe: dict, where: str) -> Params:
    """Params of a saved inference recipe (sections it does not hold get their defaults; nothing read from params.yaml)."""
    try:
        return Params.model_validate(_tabled(recipe))
    except ValidationError as e:
        raise MedrankError(_format_error(Path(where), e)) from None
