"""`medrank serve`: the trained pipeline behind HTTP (FastAPI on uvicorn), loaded once per process.

POST /rank takes `medrank rank`'s input and answers `medrank rank --all`'s JSON (the same parser, caps and output
code); POST /rank/batch several questions; POST /v1/rerank, /v2/rerank (Cohere's shape) and /rerank (TEI's) the same
pipeline in the shapes QA frameworks call (medrank.serving.rerank_api); GET /healthz (process up), /readyz (models
loaded, verified and warmed up), /version (commit, model fingerprints, the decided system), /metrics (Prometheus,
medrank.serving.observe); GET / the page. The models run on the Scheduler's threads (medrank.serving.batching),
never on the event loop; every error is one line of JSON. Nothing is fetched and nothing is written: the caches
under data/cache are read where the working folder has them, and vectors computed for one request are held in
memory for the next (medrank.encoders.memo, bounded in bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from medrank.core.errors import MedrankError
from medrank.encoders.memo import VectorMemo
from medrank.serving import rerank_api
from medrank.serving.batching import Closed, Overloaded, Scheduler
from medrank.serving.observe import CONTENT_TYPE, Metrics, timing_headers
from medrank.serving.protocol import (
    MAX_BATCH_QUESTIONS,
    RequestError,
    parse_batch,
    parse_one,
    rank_body_schema,
    rank_result_schema,
    read_body,
)
from medrank.serving.rank import MAX_INPUT_BYTES, MAX_TOTAL_CHARS, RankInput
from medrank.serving.slow_clients import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, BodyDeadline, check_timeout

if TYPE_CHECKING:
    from medrank.serving.rank import Ranker

log = logging.getLogger(__name__)
access_log = logging.getLogger("medrank.serving.access")

CONFIG_ENV = "MEDRANK_SERVE_CONFIG"  # the ServeConfig as JSON, for uvicorn's worker processes (app_from_env)


@dataclass(frozen=True)
class ServeConfig:
    """What one server process runs with (the `medrank serve` options)."""

    models: str = "models"
    fit: str = "final"
    threads: int | None = None  # torch intra-op threads of this process (None: every core)
    compute_threads: int = 1  # passes at once (each on `threads` torch threads)
    max_batch: int = 1  # questions per pass (1: each alone, bit for bit `medrank rank`)
    max_queue: int = 16  # questions waiting at most; beyond, 503 + Retry-After
    timeout_s: float = 120.0  # per request, waiting + computing; beyond, 504
    max_body_bytes: int = MAX_INPUT_BYTES
    warmup: bool = True
    header_timeout_s: float = HEADER_TIMEOUT_S  # the request headers within; beyond, 408 / closed (SlowClientProtocol)
    body_timeout_s: float = BODY_TIMEOUT_S  # the body within, from the headers; beyond, 408 (BodyDeadline)
    vector_cache_mb: int = 256  # vectors held across requests (0: none); a 768-float16 vector is 1.5 KiB
    rerank_kept_only: bool = False  # the rerank routes' default for `kept_only` (for SDKs that cannot send it)
    examples: str = (
        "data/interim/clean/answers.parquet"  # GET /example's validation questions, where the folder has them
    )

    def __post_init__(self) -> None:
        if self.fit not in ("final", "val"):
            raise MedrankError(f"fit must be final or val, got {self.fit!r}")
        for name in ("compute_threads", "max_batch"):
            if getattr(self, name) < 1:
                raise MedrankError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise MedrankError(f"threads must be at least 1, got {self.threads}")
        if self.max_queue < 1:
            raise MedrankError(f"max-queue must be at least 1, got {self.max_queue}")
        if not self.timeout_s > 0:
            raise MedrankError(f"timeout must be positive, got {self.timeout_s}")
        if self.max_body_bytes < 1:
            raise MedrankError(f"max-body-bytes must be at least 1, got {self.max_body_bytes}")
        if self.vector_cache_mb < 0:
            raise MedrankError(f"vector-cache-mb must be at least 0, got {self.vector_cache_mb}")
        check_timeout("header-timeout", self.header_timeout_s)
        check_timeout("body-timeout", self.body_timeout_s)


def warmup_input() -> RankInput:
    """A question ranked once before /readyz says ready: the whole path runs (a broken model shows there, not at a
    user's request), and the kernels for answers as long as real ones (past the encoder's 256 tokens) are set up
    then, not at the first user's question."""
    from medrank.serving.rank import as_input

    symptoms = (
        "Open-angle glaucoma often has no symptoms until vision is lost at the edges of the field of view. "
        "Angle-closure glaucoma can cause a sudden severe eye pain, headache, blurred vision and nausea. "
    )
    cataract = "Cataracts cloud the lens of the eye, so that vision becomes blurred or dim over the years. "
    return as_input(
        "What are the symptoms of glaucoma?",
        [("w1", "Glaucoma (Symptoms): " + symptoms * 12, ""), ("w2", "Cataract: " + cataract * 2, "")],
    )


# ---------------------------------------------------------------- the service


@dataclass
class Service:
    """One process's loaded pipeline, its scheduler and what /readyz and /version report."""

    config: ServeConfig
    ranker: Any = None  # medrank.serving.rank.Ranker
    scheduler: Any = None  # Scheduler
    ready: bool = False
    error: str | None = None
    loaded_s: float | None = None
    warmup_s: float | None = None
    version: dict = field(default_factory=dict)
    memo: VectorMemo | None = None  # the vectors computed for earlier requests
    metrics: Any = None  # medrank.serving.observe.Metrics

    def run(self, inputs):
        return self.ranker.rank_many(inputs)


def set_threads(threads: int | None) -> int:
    """Torch's intra-op threads for this process, set explicitly (inter-op: 1, where torch still allows it)."""
    import torch

    n = threads or os.cpu_count() or 1
    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # only settable before torch's first parallel work
        torch.set_num_interop_threads(1)
    return n


def load_ranker(config: ServeConfig) -> "Ranker":
    from medrank.serving.rank import Ranker

    return Ranker.load(config.models, config.fit)  # type: ignore[arg-type]


def git_commit() -> str | None:
    """The checkout's commit (MEDRANK_COMMIT where set, e.g. in an image), else None outside a git checkout."""
    if os.environ.get("MEDRANK_COMMIT"):
        return os.environ["MEDRANK_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def fingerprints(ranker: "Ranker", models_dir: str) -> dict[str, str]:
    """sha256 / content fingerprints of what the loaded pipeline reads: system.json, the saved steps' records, the
    fitted system's files and the encoders' weights."""
    from medrank.core import layout
    from medrank.core.io import sha256_file
    from medrank.steps import STEP_FILE, step_dir

    p, root = ranker.pipeline, Path(models_dir)
    out = {"system.json": sha256_file(root / layout.SYSTEM.name)}
    steps = ["normalize"] + [s for s, on in (("retrieve", p.retrieve), ("grids", p.grids)) if on is not None]
    steps += list(p.scores.steps)  # the saved steps the groups' scorers read (medrank.params.groups)
    for s in steps:
        record = json.loads((step_dir(s, root) / STEP_FILE).read_text(encoding="utf-8"))
        out[f"steps/{s}"] = record.get("record_sha256", sha256_file(step_dir(s, root) / STEP_FILE))
    if p.system.baseline is not None:
        f = root / layout.BASELINE_MODEL.name / f"{p.system.fit}.json"
        out[f"{layout.BASELINE_MODEL.name}/{f.name}"] = sha256_file(f)
    if p.system.mtl_meta is not None:
        out["mtl"] = str(p.system.mtl_meta.get("fingerprint") or p.system.mtl_meta.get("record_sha256") or "loaded")
    encoders = {  # the scorers' models by their name (an encoders table entry: "encoders.<name>"), then the steps'
        **{name: m for name, m in p.scores.models.items() if name.startswith("encoders.") or name == "qa"},
        "rqe": getattr(p.retrieve, "rqe", None),
        "nli": getattr(p.grids, "nli", None),
    }
    for name, enc in encoders.items():
        fp = getattr(enc, "fingerprint", None)
        if fp:
            out[name] = str(fp)
    return out


def create_app(config: ServeConfig | None = None, ranker: "Ranker | None" = None) -> "FastAPI":
    """The ASGI app; `ranker`: an already loaded pipeline (else it is loaded in the background at startup, /readyz
    answering 503 until it is loaded and warmed up)."""
    config = config or ServeConfig()
    svc = Service(config, ranker, memo=VectorMemo(config.vector_cache_mb << 20))
    svc.metrics = Metrics(svc)

    async def prepare() -> None:
        loop = asyncio.get_running_loop()
        try:
            t0 = time.perf_counter()
            if svc.ranker is None:
                svc.ranker = await loop.run_in_executor(None, load_ranker, config)
            svc.loaded_s = round(time.perf_counter() - t0, 3)
            svc.ranker.share_vectors(svc.memo)
            system = svc.ranker.pipeline.system
            if svc.scheduler.max_batch > 1 and not system.per_question:
                log.warning("micro-batching off: the system's EM prior shift reads every question of a pass")
                svc.scheduler.max_batch = 1
            svc.version = {
                "medrank": _version(),
                "commit": git_commit(),
                "fit": config.fit,
                "system": system.system,
                "models": await loop.run_in_executor(None, fingerprints, svc.ranker, config.models),
            }
            if config.warmup:
                t0 = time.perf_counter()
                await svc.scheduler.submit(warmup_input(), None)
                svc.warmup_s = round(time.perf_counter() - t0, 3)
            svc.ready = True
            log.info("ready: loaded in %.1f s, warm-up %.1f s", svc.loaded_s, svc.warmup_s or 0.0)
        except Exception as e:  # a damaged model: /readyz says so in one line, the process stays up for /healthz
            svc.error = str(e) if isinstance(e, MedrankError) else f"{type(e).__name__}: {e}"
            log.error("not ready: %s", svc.error, exc_info=not isinstance(e, MedrankError))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        set_threads(config.threads)
        svc.scheduler = Scheduler(
            svc.run, workers=config.compute_threads, max_batch=config.max_batch, max_queue=config.max_queue
        )
        await svc.scheduler.start()
        preparing = asyncio.create_task(prepare())
        yield
        # graceful: uvicorn has stopped accepting and let the open requests finish; finish what is still queued
        preparing.cancel()
        await svc.scheduler.close()

    app = FastAPI(
        title="medrank",
        version=_version(),
        summary="Filter and re-rank answers to consumer health questions (MEDIQA 2019 Task 3).",
        lifespan=lifespan,
    )
    app.state.service = svc

    def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse({"error": " ".join(str(message).split())}, status_code=status, headers=headers)

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, e: RequestError) -> JSONResponse:
        if request.url.path == "/rerank":  # a TEI client: TEI's codes (429 when overloaded) and error_type
            status = 429 if e.overloaded else e.status
            return JSONResponse(rerank_api.tei_error(status, e.message), status_code=status, headers=e.headers)
        return error(e.status, e.message, e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return error(e.status_code, f"{request.url.path}: {e.detail}", getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=e)
        return error(500, f"internal error ({type(e).__name__}); the server log has the details")

    def check_ready() -> None:
        if not svc.ready:
            why = f"models not loaded: {svc.error}" if svc.error else "models are still loading"
            raise RequestError(503, why, {"Retry-After": "5" if svc.error is None else "60"})

    def check_room(n: int) -> None:
        s = svc.scheduler
        if n > s.max_queue:
            raise RequestError(422, f"body: {n} questions; at most {s.max_queue} per call on this server")
        if s.queued + n > s.max_queue:
            s.stats.rejected += 1
            raise RequestError(
                503,
                f"the service is at capacity ({s.queued} questions waiting); retry in {s.retry_after()} s",
                {"Retry-After": str(s.retry_after())},
                overloaded=True,
            )

    async def rank_frames(request: Request, inputs: list[RankInput]) -> list[Any]:
        """Each input's result frame (medrank.serving.rank.Ranker.rank), its timings kept for the log and headers."""
        from medrank.serving.rank import empty_result

        async def one(inp: RankInput) -> Any:
            if not inp.answers:  # as `medrank rank`: nothing to rank, no model called
                return empty_result()
            try:
                result, timing = await svc.scheduler.submit(inp, config.timeout_s)
            except Overloaded as e:
                raise RequestError(503, str(e), {"Retry-After": str(e.retry_after)}, overloaded=True) from None
            except Closed as e:
                raise RequestError(503, str(e), {"Retry-After": "5"}) from None
            except asyncio.TimeoutError:
                raise RequestError(504, f"not ranked within the server's {config.timeout_s:g} s timeout") from None
            except MedrankError as e:
                raise RequestError(500, str(e)) from None
            request.scope.setdefault("state", {}).setdefault("medrank", []).append(timing)
            svc.metrics.observe_question(timing)
            return result

        return list(await asyncio.gather(*(one(i) for i in inputs)))

    async def rank_inputs(request: Request, inputs: list[RankInput]) -> list[dict]:
        from medrank.serving.rank import result_record

        frames = await rank_frames(request, inputs)
        return [await run_in_threadpool(result_record, i.question, f, True) for i, f in zip(inputs, frames)]

    def timed(request: Request, body: Any, started: float) -> JSONResponse:
        timings = request.scope.get("state", {}).get("medrank", [])
        return JSONResponse(body, headers=timing_headers(timings, (time.perf_counter() - started) * 1000))

    rank_schema = rank_body_schema()

    @app.post(
        "/rank",
        summary="Rank one question's answers",
        description="`medrank rank`'s input; answers `medrank rank --all`'s JSON: kept answers in rank order, then the "
        "dropped ones. 400: not JSON; 413: body too large; 422: a field is wrong (the message names it); 503: at "
        "capacity (Retry-After) or not ready; 504: timed out.",
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": rank_schema}}}},
        responses={200: {"content": {"application/json": {"schema": rank_result_schema()}}}},
    )
    async def rank(request: Request) -> JSONResponse:
        started = time.perf_counter()
        check_ready()
        check_room(1)  # before the body is read: a refused request costs no memory
        inp = await run_in_threadpool(parse_one, await read_body(request, config.max_body_bytes))
        return timed(request, (await rank_inputs(request, [inp]))[0], started)

    @app.post(
        "/rank/batch",
        summary="Rank several questions in one call",
        description=f'`{{"questions": [<a /rank body>, ...]}}`, at most {MAX_BATCH_QUESTIONS} questions and '
        f'{MAX_TOTAL_CHARS} characters in all; answers `{{"results": [<a /rank answer>, ...]}}` in the same order.',
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["questions"],
                            "properties": {
                                "questions": {"type": "array", "maxItems": MAX_BATCH_QUESTIONS, "items": rank_schema}
                            },
                        }
                    }
                },
            }
        },
    )
    async def rank_batch(request: Request) -> JSONResponse:
        started = time.perf_counter()
        check_ready()
        check_room(1)
        body = await read_body(request, config.max_body_bytes)
        inputs = await run_in_threadpool(parse_batch, body, min(MAX_BATCH_QUESTIONS, svc.scheduler.max_queue))
        check_room(sum(1 for i in inputs if i.answers))
        return timed(request, {"results": await rank_inputs(request, inputs)}, started)

    async def rerank(request: Request, parse: Any, respond: Any) -> JSONResponse:
        started = time.perf_counter()
        check_ready()
        check_room(1)
        body = await read_body(request, config.max_body_bytes)
        kept_only = _query_flag(request, "kept_only", config.rerank_kept_only)
        req = await run_in_threadpool(parse, body, kept_only)
        (frame,) = await rank_frames(request, [req.inp])
        return timed(request, respond(req, frame), started)

    rerank_doc = (
        "The same pipeline as /rank; every document best first (medrank's submission order), scores in [0, 1] with "
        "kept answers above 0.5, each result with `kept` and `filter_score` too; `kept_only` (body or query) returns "
        "the kept ones only. docs/serving.md has the mapping and the clients."
    )

    @app.post("/v1/rerank", summary="Cohere's rerank (v1)", description=rerank_doc)
    async def cohere_v1(request: Request) -> JSONResponse:
        return await rerank(request, lambda b, k: rerank_api.parse_cohere(b, 1, k), rerank_api.cohere_response)

    @app.post("/v2/rerank", summary="Cohere's rerank (v2)", description=rerank_doc)
    async def cohere_v2(request: Request) -> JSONResponse:
        return await rerank(request, lambda b, k: rerank_api.parse_cohere(b, 2, k), rerank_api.cohere_response)

    @app.post(
        "/rerank",
        summary="text-embeddings-inference's rerank",
        description=rerank_doc + " TEI's status codes: 413, 422, 429 when at capacity.",
    )
    async def tei(request: Request) -> JSONResponse:
        return await rerank(request, rerank_api.parse_tei, rerank_api.tei_response)

    examples: list = []

    @app.get("/example", summary="A MEDIQA validation question and CHiQA's answers (a /rank body), where present")
    async def example(request: Request) -> JSONResponse:
        raw = request.query_params.get("index", "0")
        if not raw.lstrip("-").isdigit() or len(raw) > 12:
            raise RequestError(422, f"index: expected an integer, got {raw[:40]!r}")
        index = int(raw)
        if not examples:
            from medrank.serving.examples import validation_questions

            try:
                loaded = await run_in_threadpool(validation_questions, config.examples)
            except MedrankError as e:
                raise RequestError(404, f"no examples: {e}") from None
            examples[:] = loaded  # two first requests at once: both load, neither doubles the list
        q = examples[index % len(examples)]
        return JSONResponse({"index": index % len(examples), "of": len(examples), **q})

    @app.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(svc.metrics.scrape(), media_type=CONTENT_TYPE)

    @app.get("/healthz", summary="The process is up")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", summary="Models loaded, verified and warmed up")
    async def readyz() -> JSONResponse:
        s = svc.scheduler
        body = {
            "status": "ready" if svc.ready else ("failed" if svc.error else "loading"),
            "pid": os.getpid(),  # which process answered (several workers or replicas)
            **({"error": svc.error} if svc.error else {}),
            "loaded_s": svc.loaded_s,
            "warmup_s": svc.warmup_s,
            "queued": s.queued if s else 0,
            "running": s.running if s else 0,
            "max_queue": config.max_queue,
            "max_batch": s.max_batch if s else config.max_batch,
            "stats": asdict(s.stats) if s else None,
        }
        return JSONResponse(body, status_code=200 if svc.ready else 503)

    @app.get("/version", summary="Commit, model fingerprints and the decided system")
    async def version() -> JSONResponse:
        check_ready()
        return JSONResponse(svc.version)

    page = resources.files("medrank.serving").joinpath("page.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        # everything is inline: the page loads nothing from anywhere, and may only talk to this server
        csp = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'"
        return HTMLResponse(page, headers={"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff"})

    app.add_middleware(BodyDeadline, timeout_s=config.body_timeout_s)
    app.add_middleware(AccessLog, metrics=svc.metrics)
    return app


def _query_flag(request: Request, name: str, default: bool) -> bool:
    """A true/false query parameter; anything else is a 422 naming it."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    value = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}.get(raw.lower())
    if value is None:
        raise RequestError(422, f"?{name}: expected true or false, got {raw[:40]!r}")
    return value


class AccessLog:
    """ASGI middleware: one JSON line per request on logger medrank.serving.access (method, path, status, ms, bytes
    in / out, client, and for ranked questions their queue and compute times and pass size)."""

    def __init__(self, app: Any, metrics: Metrics | None = None) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        seen = {"status": 500, "bytes_out": 0, "bytes_in": 0}

        async def counting_receive():
            message = await receive()
            seen["bytes_in"] += len(message.get("body", b""))
            return message

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            elif message["type"] == "http.response.body":
                seen["bytes_out"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counting_receive, counting_send)
        finally:
            record = {
                "method": scope.get("method"),
                "path": scope.get("path"),
                "status": seen["status"],
                "ms": round((time.perf_counter() - start) * 1000, 1),
                "bytes_in": seen["bytes_in"],
                "bytes_out": seen["bytes_out"],
                "client": (scope.get("client") or [None])[0],
            }
            timings = scope.get("state", {}).get("medrank")
            if timings:
                record["questions"] = timings
            access_log.info(json.dumps(record, separators=(",", ":")))
            if self.metrics is not None:
                route = getattr(scope.get("route"), "path", None) or "unmatched"  # bounded labels: no raw paths
                self.metrics.observe_request(route, seen["status"], time.perf_counter() - start)


def _version() -> str:
    from medrank import __version__

    return __version__


def app_from_env() -> Any:
    """uvicorn's factory in each worker process (`medrank serve --workers N`): the config from MEDRANK_SERVE_CONFIG."""
    raw = os.environ.get(CONFIG_ENV)
    return create_app(ServeConfig(**json.loads(raw)) if raw else ServeConfig())
