"""The naive peer benchmarks/serve.py runs beside `medrank serve`: a FastAPI endpoint calling sentence-transformers'
`encode` on the question and the answers and ordering them by cosine. It takes /rank's body and loads the very
encoder medrank's decided system reads (the same weights, max length and precision as the loaded pipeline resolves
them), so the two differ by what medrank does around the encoder: text cleaning, features, the fitted filter and
ranker, its queue, its vector cache. It keeps nothing between requests and has no queue bound.

    python benchmarks/peer_server.py --models models --port 8001 [--threads 2]
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def encoder_settings(models: Path) -> dict:
    """{path, max_length, precision} of the bi-encoder medrank's decided system reads, as the pipeline resolves them."""
    from medrank.encoders.hardware import hardware_precision
    from medrank.serving.rank import Ranker

    here = Path.cwd()
    os.chdir(Path(models).resolve().parent)  # a pinned base model resolves under the folder's models/base
    try:
        scores = Ranker.load(Path(models).resolve().name).pipeline.scores
    finally:
        os.chdir(here)
    bi = scores.models.get(f"encoders.{scores.p.bienc.encoder}")
    if bi is None:
        sys.exit("error: the decided system reads no bi-encoder: there is no like-for-like peer")
    return {
        "path": str(bi.path),
        "max_length": bi.max_length,
        "precision": hardware_precision(bi.device, scores.p.encoder_of("bienc").precision),
    }


def create_peer(settings: dict):
    import numpy as np
    import torch
    from fastapi import FastAPI, Request
    from sentence_transformers import SentenceTransformer
    from starlette.concurrency import run_in_threadpool

    # medrank's OpenVINO path at a precision: the peer runs torch at that precision (sentence-transformers' own path)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[settings["precision"].removeprefix("openvino-")]
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    # built from its modules: the PyPI-packaged folder lacks 1_Pooling/, which sentence-transformers 6 needs to load it
    # whole (the same modules as its modules.json: the transformer, mean pooling, unit vectors)
    body = Transformer(settings["path"], model_kwargs={"torch_dtype": dtype}, max_seq_length=settings["max_length"])
    model = SentenceTransformer(
        modules=[body, Pooling(body.get_embedding_dimension(), "mean"), Normalize()], device="cpu"
    )
    app = FastAPI()

    def rank(body: dict) -> dict:
        texts = [body["question"]] + [a["text"] for a in body["answers"]]
        emb = model.encode(texts, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
        cos = emb[1:] @ emb[0]
        order = np.argsort(-cos, kind="stable")
        return {"answers": [{"id": body["answers"][i].get("id", str(i + 1)), "score": float(cos[i])} for i in order]}

    @app.post("/rank")
    async def _rank(request: Request) -> dict:
        return await run_in_threadpool(rank, await request.json())

    @app.get("/readyz")
    async def _ready() -> dict:
        return {"status": "ready", "stats": {}, "settings": settings}

    rank({"question": "warm up", "answers": [{"text": "a first answer " * 40}]})
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=ROOT / "models")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `medrank serve`
    import torch
    import uvicorn

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    app = create_peer(encoder_settings(args.models))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
