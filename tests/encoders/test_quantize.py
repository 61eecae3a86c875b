"""quantize_int8 on a tiny random BERT: a copy (the model untouched), the chosen layers in fp32, close to fp32."""

from __future__ import annotations

import pytest
import torch

from copy import deepcopy as copy_module

from medrank.encoders.low_precision import Int8Linear, bf16_linears, int8_keeps_fp32, quantize_int8
from medrank.core.errors import MedrankError
from tests.helpers.models import tiny_bert_config

pytestmark = pytest.mark.usefixtures("one_thread")  # the 2 cores are shared


@pytest.fixture(scope="module")
def tiny_classifier() -> torch.nn.Module:
    """A randomly initialised 2-layer, hidden-32 BERT with a 3-way head (in memory: no tokenizer needed)."""
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    cfg = tiny_bert_config(100, num_labels=3)
    return BertForSequenceClassification(cfg).eval()


def _batch(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (8, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[4:, 16:] = 0  # padded rows, as predict's dynamic padding makes them
    return {"input_ids": ids * mask, "attention_mask": mask}


def test_quantized_copy_leaves_the_model_untouched(tiny_classifier):
    before = {k: v.clone() for k, v in tiny_classifier.state_dict().items()}
    q = quantize_int8(tiny_classifier)
    assert q is not tiny_classifier
    after = tiny_classifier.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not any(isinstance(m, Int8Linear) for m in tiny_classifier.modules())


def test_chosen_layers_stay_fp32_the_rest_int8(tiny_classifier):
    q = quantize_int8(tiny_classifier)
    linears = [n for n, m in tiny_classifier.named_modules() if isinstance(m, torch.nn.Linear)]
    kept = [n for n in linears if int8_keeps_fp32(n)]
    # the FFN output projections (not the attention output's), the pooler and the head
    assert kept == [
        "bert.encoder.layer.0.output.dense",
        "bert.encoder.layer.1.output.dense",
        "bert.pooler.dense",
        "classifier",
    ]
    for name in linears:
        got = q.get_submodule(name)
        assert type(got) is (torch.nn.Linear if name in kept else Int8Linear), name
        if name in kept:
            assert got.weight.dtype == torch.float32
    # query, key and value read one tensor: one set of fp32 outlier channels and one shared int8 copy of it
    qkv = [q.get_submodule(f"bert.encoder.layer.0.attention.self.{n}") for n in ("query", "key", "value")]
    assert qkv[0].shared is not None and all(m.shared is qkv[0].shared for m in qkv)
    assert len(qkv[0].outliers) > 0 and all(torch.equal(m.outliers, qkv[0].outliers) for m in qkv)


def test_int8_predicts_close_to_fp32(tiny_classifier):
    batch = _batch()
    q = quantize_int8(tiny_classifier)
    with torch.inference_mode():
        ref = tiny_classifier(**batch).logits
        got = q(**batch).logits
        again = q(**batch).logits
    assert got.shape == ref.shape and got.dtype == torch.float32
    assert torch.equal(got, again)  # the shared int8 copy is never reused across calls
    assert (got.softmax(-1) - ref.softmax(-1)).abs().max() < 0.01
    assert (got - ref).abs().max() < 0.02 * ref.abs().max()


def test_int8_linear_matches_linear():
    torch.manual_seed(0)
    for bias in (True, False):
        lin = torch.nn.Linear(48, 24, bias=bias)
        x = torch.randn(3, 5, 48)
        x[..., 7] *= 30.0  # an outlier channel in every token: kept in fp32, it does not coarsen the others
        with torch.inference_mode():
            ref = lin(x)
            plain, split = Int8Linear(lin)(x), Int8Linear(lin, torch.tensor([7]))(x)
        assert plain.shape == split.shape == ref.shape
        err = lambda y: float(((y - ref).norm() / ref.norm()))
        assert err(split) < 0.01 and err(split) < err(plain) / 3


def test_not_a_module_is_one_error_line():
    with pytest.raises(MedrankError, match="quantize_int8: expected a torch.nn.Module"):
        quantize_int8("models/nli")  # type: ignore[arg-type]


def test_bf16_weight_copy_gives_autocasts_bits_and_shares_the_rest(tiny_classifier):
    copy = bf16_linears(tiny_classifier)
    lin = [n for n, m in tiny_classifier.named_modules() if isinstance(m, torch.nn.Linear)]
    assert all(copy.get_submodule(n).weight.dtype == torch.bfloat16 for n in lin)
    assert all(tiny_classifier.get_submodule(n).weight.dtype == torch.float32 for n in lin)  # the model untouched
    emb = "bert.embeddings.word_embeddings.weight"
    assert copy.get_parameter(emb) is tiny_classifier.get_parameter(emb)  # not a Linear: shared, not copied
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = tiny_classifier(**_batch()).logits
        got = copy(**_batch()).logits
    assert torch.equal(want, got)


def test_bf16_copy_is_rebuilt_after_the_weights_change(tiny_classifier):
    from medrank.encoders.low_precision import PrecisionCopies

    class Holder(PrecisionCopies):
        def __init__(self, model):
            self.model = model

    h = Holder(copy_module(tiny_classifier))
    first = h.inference_model("bf16")
    assert h.inference_model("bf16") is first  # cached while the weights are the same
    with torch.no_grad():
        h.model.classifier.weight.add_(1.0)  # an in-place update, as an optimizer step makes
    again = h.inference_model("bf16")
    assert again is not first
    assert torch.equal(again.classifier.weight, h.model.classifier.weight.to(torch.bfloat16))
    assert h.inference_model("fp32") is h.model
