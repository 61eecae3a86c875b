"""medrank.models.mtl: grid encoder shapes, masking, pairwise head/loss, ensembling, training, the stage recipe."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from medrank.core.errors import MedrankError
from medrank.core.io import RECORD_SHA256, write_sealed_json
from medrank.selection import decision as D
from medrank.selection import evaluation as E
from medrank.models import mtl
from medrank.selection.experiment import LOSO
from medrank.models.mtl.fits import fit_many
from medrank.params import MtlParams

H = 8  # hidden size of the fake NLI / RQE vectors


pytestmark = pytest.mark.usefixtures("one_thread")  # the 2 cores are shared


SPLITS = {"train_liveqa": 10, "train_alexa": 10, "val": 6, "test": 4}


def fake_tables(
    seed: int = 0,
    splits: dict = SPLITS,
    n_candidates: int = 2,
    max_sentences: int = 3,
    top_k: int = 2,
    augment_top: int = 2,
):
    """Normalized answers + embed-stage tables (schemas of medrank.encoders.extract) with a learnable signal:
    a candidate's quality shifts channel 0 of its grid cells; label = quality > 0.2, reference rank by quality."""
    rng = np.random.default_rng(seed)
    ans, grid, ret = [], [], []
    for split, nq in splits.items():
        labelled = split != "test"
        for q in range(nq):
            qid = f"{split[:2]}{q}"
            nc = int(rng.integers(2, 7))
            quality = rng.normal(size=nc)
            rr = np.empty(nc, int)
            rr[np.argsort(-quality)] = np.arange(1, nc + 1)
            for c in range(nc):
                ns = 0 if (q == 0 and c == 0) else int(rng.integers(1, 6))  # one answer without sentences
                ans.append(
                    dict(
                        split=split,
                        qid=qid,
                        question="q",
                        question_raw="q",
                        aid=f"{qid}_{c + 1}",
                        answer="a",
                        answer_raw="a",
                        url="u",
                        source=str(rng.choice(["medlineplus", "mayoclinic"])),
                        answer_pos=c + 1,
                        system_rank=c + 1 if labelled else None,
                        reference_rank=int(rr[c]) if labelled else None,
                        reference_score=(4 if quality[c] > 0.2 else 2) if labelled else None,
                        label=int(quality[c] > 0.2) if labelled else None,
                        question_norm="q",
                        answer_norm="a " * ns,
                        answer_sentences=[f"s{i}" for i in range(ns)],
                    )
                )
            n_e = int(rng.integers(1, n_candidates + 1))
            for r in range(1, n_e + 1):
                score = float(rng.random())
                ret.append(
                    dict(
                        split=split,
                        qid=qid,
                        question="q",
                        rank=r,
                        qa_id=f"mq{q}_{r}",
                        rqe_score=score,
                        bm25_rank=r,
                        passes_threshold=score >= 0.3 or r == 1,
                        entailed_question="e?",
                        entailed_answer="e e e",
                        entailed_sentences=["e"] * 3,
                        entailed_collection="c",
                        rqe_cls=rng.normal(size=H).astype(np.float16),
                    )
                )
            ents = [("rqe", r, f"mq{q}_{r}", int(rng.integers(1, 8))) for r in range(1, n_e + 1)]
            for c in range(nc):
                mine = list(ents)
                if split.startswith("train"):
                    mine += [
                        ("augment", int(rr[h]), f"{qid}_{h + 1}", 3)
                        for h in range(nc)
                        if rr[h] <= augment_top and rr[h] < rr[c]
                    ]
                ns = len(ans[len(ans) - nc + c]["answer_sentences"])
                for kind, er, eid, ne in mine:
                    nr, ncol = min(ns, max_sentences), min(ne, max_sentences, top_k)
                    cls = rng.normal(size=(nr, ncol, H)).astype(np.float32)
                    cls[..., 0] += 2 * quality[c]
                    pe = rng.random(nr * ncol).astype(np.float32)
                    grid.append(
                        dict(
                            split=split,
                            qid=qid,
                            aid=f"{qid}_{c + 1}",
                            entailed_kind=kind,
                            entailed_rank=er,
                            entailed_id=eid,
                            n_sentences_a=ns,
                            n_sentences_e=ne,
                            n_rows=nr,
                            n_cols=ncol,
                            e_index=np.zeros(nr * ncol, np.int16),
                            p_entail=pe,
                            p_neutral=pe,
                            p_contradiction=pe,
                            nli_cls=cls.reshape(-1).astype(np.float16),
                            anli=float(pe.reshape(nr, ncol).max(1).mean()) if nr * ncol else 0.0,
                        )
                    )
    return pd.DataFrame(ans), pd.DataFrame(grid), pd.DataFrame(ret)


@pytest.fixture(scope="module")
def tables():
    return fake_tables()


@pytest.fixture(scope="module")
def data(tables):
    a, g, ret = tables
    return mtl.build_mtl_data(a, g, ret, n_candidates=2)


def tiny_config(**kw) -> MtlParams:
    base = dict(
        proj_channels=8,
        conv_channels=[8, 8, 4, 4],
        rqe_dim=4,
        filter_hidden=[16],
        pair_hidden=[16],
        dropout=0.0,
        max_epochs=6,
        patience=3,
        questions_per_batch=4,
        pair_scope="all",
        ensemble="sum",
    )
    base.update(kw)
    return MtlParams(**base)


def gids_of(data: mtl.MTLData, prefix: str) -> list[str]:
    return [g for g in pd.unique(data.cand["gid"]) if g.startswith(prefix)]


# ---------------------------------------------------------------- data


def test_fake_tables_match_the_stage_schemas(tables, tmp_path):
    from medrank.task3.grids import NLI_GRID
    from medrank.core.io import write_parquet
    from medrank.task3.retrieval import retrieved_schema

    _, g, ret = tables
    write_parquet(g, tmp_path / "g.parquet", NLI_GRID)  # raises if the fake drifted from the real schema
    write_parquet(ret, tmp_path / "r.parquet", retrieved_schema(H))


def test_build_mtl_data_rows_shapes_and_empty_answers(tables, data):
    a, g, _ = tables
    assert len(data.cand) == len(a)
    assert len(data.pairs) == len(g)  # every grid row used (all ranks <= 2); no candidate lacks a grid
    assert data.hidden_size == H and data.rqe_size == H
    assert data.pairs["augmented"].sum() == (g["entailed_kind"] == "augment").sum()
    # the answer without sentences gets a 1×1 empty grid
    empty = data.cand.index[data.cand["n_sentences"] == 0]
    rows = data.pairs.index[data.pairs["cand"].isin(empty)]
    assert len(rows) and all(data.grids[i].shape == (1, 1, H) and not data.grids[i].any() for i in rows)
    # augmented rows carry a zero RQE vector; retrieved rows their question's vector
    aug = data.pairs["augmented"].to_numpy() == 1
    assert not data.rqe[aug].any() and data.rqe[~aug].any(axis=1).all()


def test_augment_without_augmentation_pairs_is_one_error_naming_the_row(data):
    """embed.augment_top 0 (the default) leaves no augmentation pairs: a config asking to train on them fails in one line
    naming it, instead of training silently like augment: false."""
    plain = data.pairs["augmented"].to_numpy() == 0
    bare = mtl.MTLData(
        data.cand, data.pairs[plain].drop(columns="gid"), [g for g, k in zip(data.grids, plain) if k], data.rqe[plain]
    )
    mtl.check_augmentation(data, {"mtl.augment": MtlParams(augment=True)})  # the pairs exist: fine
    mtl.check_augmentation(bare, {"mtl.augment": MtlParams(augment=False)})
    with pytest.raises(
        MedrankError, match=r"params.yaml: analysis.mtl.rows \(aug\): augment needs .*embed.augment_top > 0"
    ):
        mtl.check_augmentation(
            bare,
            {"analysis.mtl.rows (plain)": MtlParams(augment=False), "analysis.mtl.rows (aug)": MtlParams(augment=True)},
        )


def test_candidate_without_entailed_answer_is_still_scored(tables):
    a, g, ret = tables
    q = a["qid"].iloc[0]
    ret = ret.assign(passes_threshold=ret["passes_threshold"] & (ret["qid"] != q))  # fallback only: no ANLI needed
    d = mtl.build_mtl_data(a, g[g["qid"] != q], ret, n_candidates=2)
    none = d.pairs[d.pairs["entailed"] == "none"]
    assert len(none) == (a["qid"] == q).sum()
    assert all(d.grids[i].shape == (1, 1, H) for i in none.index)


def test_n_candidates_and_missing_questions(tables):
    a, g, ret = tables
    # N is applied once, by stage retrieve: tables of N = 1 give rank-1 pairs only; a table of another N is an error
    g1 = g[(g["entailed_kind"] == "augment") | (g["entailed_rank"] <= 1)]
    d1 = mtl.build_mtl_data(a, g1, ret[ret["rank"] <= 1], n_candidates=1)
    rqe_rows = d1.pairs[d1.pairs["augmented"] == 0]
    assert set(rqe_rows["entailed"].str.extract(r"_(\d+)$")[0].astype(int)) == {1}
    with pytest.raises(MedrankError, match="rank up to 2 for n_candidates 1: the tables come from another run"):
        mtl.build_mtl_data(a, g, ret, n_candidates=1)
    # questions without retrieval results (a capped tiny profile) are left out, not an error
    q = a["qid"].iloc[0]
    d2 = mtl.build_mtl_data(a, g, ret[ret["qid"] != q], n_candidates=2)
    assert len(d2.cand) == (a["qid"] != q).sum()
    # answers the (capped) embed stage did not reach are left out too
    split, aid = a["split"].iloc[1], a["aid"].iloc[1]
    d3 = mtl.build_mtl_data(a, g[(g["aid"] != aid) | (g["split"] != split)], ret, n_candidates=2)
    assert len(d3.cand) == len(a) - 1 and (split, aid) not in set(zip(d3.cand["split"], d3.cand["aid"]))


# ---------------------------------------------------------------- encoder


def _cells(grids):
    h = torch.tensor([g.shape[0] for g in grids])
    w = torch.tensor([g.shape[1] for g in grids])
    cells = torch.cat([torch.as_tensor(g).reshape(-1, g.shape[2]) for g in grids])
    return cells, h, w


@pytest.mark.parametrize("shape", [(1, 1), (1, 4), (4, 1), (3, 2), (5, 5), (12, 7)])
def test_encoder_output_shape_for_any_grid(shape):
    torch.manual_seed(0)
    enc = mtl.GridEncoder(H, 6, (6, 6, 5, 5))
    grids = [torch.randn(*shape, H), torch.randn(*shape, H)]
    out = enc(*_cells(grids))
    assert out.shape == (2, 20) and torch.isfinite(out).all()


def test_encoder_vector_does_not_depend_on_batch_mates():
    torch.manual_seed(0)
    enc = mtl.GridEncoder(H, 6, (6, 6, 5, 5))
    enc.train()
    grids = [torch.randn(a, c, H) for a, c in [(1, 1), (5, 2), (3, 3), (2, 5), (5, 5)]]
    enc(*_cells(grids))  # one training step to move the running statistics away from their init
    enc.eval()
    together = enc(*_cells(grids))
    alone = torch.cat([enc(*_cells([g])) for g in grids])
    assert torch.allclose(together, alone, atol=1e-5)


def test_masked_batchnorm_uses_valid_cells_only():
    bn = mtl.MaskedBatchNorm2d(3)
    x = torch.randn(2, 3, 4, 4)
    mask = torch.zeros(2, 1, 4, 4)
    mask[0, :, :2, :3] = 1
    mask[1, :, :4, :1] = 1
    x_pad = x * mask + (1 - mask) * 1e3  # garbage in the padding must not move the statistics
    y = bn(x_pad, mask)
    valid = x.permute(1, 0, 2, 3)[:, mask[:, 0].bool()]  # C, n_valid
    expected = (valid - valid.mean(1, keepdim=True)) / torch.sqrt(valid.var(1, unbiased=False, keepdim=True) + bn.eps)
    assert torch.allclose(y.permute(1, 0, 2, 3)[:, mask[:, 0].bool()], expected, atol=1e-4)
    assert (y * (1 - mask)).abs().max() == 0


def test_quadrant_pool_averages_each_quadrant():
    x = torch.arange(9, dtype=torch.float32).reshape(1, 1, 3, 3)
    out = mtl.quadrant_pool(x, torch.tensor([3]), torch.tensor([3]))
    # odd sides share the middle row/column: top-left = rows 0-1 × cols 0-1, etc.
    assert out.tolist() == [[2.0, 3.0, 5.0, 6.0]]
    one = mtl.quadrant_pool(torch.full((1, 2, 1, 1), 7.0), torch.tensor([1]), torch.tensor([1]))
    assert one.tolist() == [[7.0] * 8]


# ---------------------------------------------------------------- heads and loss


def test_net_without_nli_grid_has_no_encoder():
    cfg = MtlParams(
        proj_channels=4, conv_channels=[4, 4, 4, 4], rqe_dim=3, filter_hidden=[8], pair_hidden=[8], nli_grid=False
    )
    net = mtl.MTLNet(cfg, hidden_size=6, rqe_size=5, meta_dim=2, pair_dim=4).eval()
    assert net.encoder is None and net.joint_dim == 3 + 2 + 4
    cells, h, w = torch.zeros(4, 6), torch.tensor([2, 1]), torch.tensor([1, 2])
    joint = net.joint(cells, h, w, torch.randn(2, 5), torch.randn(2, 2), torch.randn(2, 4))
    assert joint.shape == (2, 9)


def test_pair_head_is_antisymmetric():
    torch.manual_seed(0)
    net = mtl.MTLNet(tiny_config(), H, H, 3, len(mtl.PAIR_FEATURES)).eval()
    joint = torch.randn(5, net.joint_dim)
    i, j = torch.tensor([0, 1, 2]), torch.tensor([3, 4, 0])
    assert torch.allclose(net.pair_logits(joint, i, j), -net.pair_logits(joint, j, i), atol=1e-6)


def test_pair_index_targets_follow_reference_rank():
    groups = np.array(["a", "a", "a", "b", "b"])
    ranks = np.array([2.0, 1.0, 3.0, 1.0, 1.0])
    i, j, t = mtl.pair_index(groups, ranks)
    pairs = {(int(a), int(b)): float(y) for a, b, y in zip(i, j, t)}
    assert pairs == {(0, 1): 0.0, (0, 2): 1.0, (1, 2): 1.0}  # equal ranks (group b) give no pair


@pytest.mark.parametrize("seed", range(5))
def test_pair_index_lists_every_same_group_pair_in_a_fixed_order(seed):
    """Groups in order of first appearance, rows ascending within each: the order the pairwise loss sums in (the
    weights depend on it), the same as a plain loop over the groups."""
    rng = np.random.default_rng(seed)
    groups = np.array([f"q{a}\0e{b}" for a, b in zip(rng.integers(0, 4, 40), rng.integers(0, 3, 40))], dtype=object)
    i, j, t = mtl.pair_index(groups, None)
    expected = [
        (a, b)
        for g in dict.fromkeys(groups)
        for a in range(40)
        for b in range(a + 1, 40)
        if groups[a] == groups[b] == g
    ]
    assert list(zip(i.tolist(), j.tolist())) == expected and not t.any()


def test_pairwise_loss_sign():
    f = torch.zeros(2)
    y = torch.tensor([1.0, 0.0])
    right = mtl.mtl_loss(f, y, torch.tensor([4.0]), torch.tensor([1.0]), 2.0, 1)
    wrong = mtl.mtl_loss(f, y, torch.tensor([-4.0]), torch.tensor([1.0]), 2.0, 1)
    assert right[2] < 0.05 < 4.0 < wrong[2]
    # total = filter + alpha * pair, per question
    assert torch.isclose(wrong[0], wrong[1] + 2.0 * wrong[2])
    two_q = mtl.mtl_loss(f, y, torch.tensor([-4.0]), torch.tensor([1.0]), 2.0, 2)
    assert torch.isclose(two_q[0], wrong[0] / 2)


# ---------------------------------------------------------------- ensembling and decisions


def _toy_predictions():
    f = pd.DataFrame(
        {
            "gid": ["q"] * 6,
            "aid": ["a", "b", "c", "a", "b", "c"],
            "entailed": ["e1", "e1", "e1", "e2", "e2", "e2"],
            "prob": [0.9, 0.4, 0.1, 0.7, 0.2, 0.3],
        }
    )
    rows = []
    pij = {
        "e1": {("a", "b"): 0.8, ("a", "c"): 0.9, ("b", "c"): 0.6},
        "e2": {("a", "b"): 0.6, ("a", "c"): 0.7, ("b", "c"): 0.2},
    }
    for e, d in pij.items():
        for (x, y), v in d.items():
            rows += [("q", e, x, y, v), ("q", e, y, x, 1 - v)]
    return f, pd.DataFrame(rows, columns=["gid", "entailed", "aid_i", "aid_j", "prob"])


def test_ensemble_sums_over_entailed_answers():
    f, p = _toy_predictions()
    e = mtl.ensemble(f, p, "sum").set_index("aid")
    assert e.loc["a", "prob"] == pytest.approx(1.6) and e.loc["b", "prob"] == pytest.approx(0.6)
    assert e.loc["c", "prob"] == pytest.approx(0.4)
    # pair_score(a) = Σ_j Σ_e P_e(a above j) = (0.8 + 0.6) + (0.9 + 0.7)
    assert e.loc["a", "pair_score"] == pytest.approx(3.0)
    assert e.loc["c", "pair_score"] == pytest.approx((0.1 + 0.3) + (0.4 + 0.8))
    assert (e["n_entailed"] == 2).all()
    m = mtl.ensemble(f, p, "mean").set_index("aid")
    assert m.loc["a", "prob"] == pytest.approx(0.8) and m.loc["a", "pair_score"] == pytest.approx(1.5)
    x = mtl.ensemble(f, p, "max").set_index("aid")
    assert x.loc["b", "prob"] == pytest.approx(0.4) and x.loc["a", "pair_score"] == pytest.approx(0.8 + 0.9)
    with pytest.raises(MedrankError):
        mtl.ensemble(f, p, "median")


def test_decide_keeps_above_threshold_and_orders_kept_first_by_pairwise_score():
    f, p = _toy_predictions()
    ens = mtl.ensemble(f, p, "sum")
    d = D.decide(ens, 0.5, MtlParams(ensemble="sum", rank_by="pairwise"))
    assert dict(zip(d["aid"], d["label"])) == {"a": 1, "b": 1, "c": 0}
    order = list(d.sort_values("score", ascending=False)["aid"])
    assert order == ["a", "b", "c"]
    # ranking by the filter instead: same here; with min_keep the best answer is kept whatever the threshold
    d2 = D.decide(ens, 5.0, MtlParams(ensemble="sum", min_keep=1))
    assert dict(zip(d2["aid"], d2["label"])) == {"a": 1, "b": 0, "c": 0}


# ---------------------------------------------------------------- training


def test_loss_decreases_and_model_learns_the_signal(data):
    train = gids_of(data, "train")
    model = mtl.fit_mtl(
        data, train, tiny_config(max_epochs=8, patience=8), mtl.builder_factory(["metadata"], 2)(), seed=3
    )
    losses = [h["train_loss"] for h in model.history]
    assert losses[-1] < 0.7 * losses[0]
    f, p = model.predict(data, gids_of(data, "val"))
    ens = mtl.with_truth(mtl.ensemble(f, p, "mean"), data.cand)
    # quality drives both the label and the grids: the filter must separate them
    from sklearn.metrics import roc_auc_score

    assert roc_auc_score(ens["label"].astype(int), ens["prob"]) > 0.8


def test_training_is_seeded(data):
    train = gids_of(data, "train")
    cfg = tiny_config(max_epochs=2)
    a = mtl.fit_mtl(data, train, cfg, mtl.builder_factory(["metadata"], 2)(), seed=5)
    b = mtl.fit_mtl(data, train, cfg, mtl.builder_factory(["metadata"], 2)(), seed=5)
    fa, pa_ = a.predict(data, gids_of(data, "val"))
    fb, pb = b.predict(data, gids_of(data, "val"))
    assert np.allclose(fa["prob"], fb["prob"]) and np.allclose(pa_["prob"], pb["prob"])


@pytest.mark.parametrize("pair_scope", ["all", "valid_both"])
def test_inner_eval_in_one_pass_equals_a_batch_per_question(data, pair_scope):
    """Early stopping reads the inner split's loss: one forward over every question must give what a forward per
    question (each its own batch) gives, to float rounding."""
    from medrank.models.mtl import training as T

    model = mtl.fit_mtl(
        data, gids_of(data, "train"), tiny_config(max_epochs=2), mtl.builder_factory(["metadata"], 2)(), seed=4
    )
    prep = model.prepare(data)
    rows = data.pair_rows(gids_of(data, "val"), augmented=False)
    gid_of = data.pairs["gid"].to_numpy()
    batcher = T.Batcher(data, prep, torch.device("cpu"), T.MAX_CELLS_PER_CHUNK)
    got = T._inner_eval(model.net, batcher, prep, rows, gid_of, 2.0, torch.device("cpu"), pair_scope)
    losses, right, n, pright, pn = [], 0, 0, 0, 0
    with torch.no_grad():
        for idx in pd.Series(rows).groupby(gid_of[rows], sort=False).indices.values():
            loss, lf, lp, fl, y, pl, t = T._batch_loss(
                model.net, batcher, prep, rows[idx], 2.0, 1, torch.device("cpu"), pair_scope
            )
            losses.append((float(loss), float(lf), float(lp)))
            right, n = right + int(((fl > 0).float() == y).sum()), n + len(idx)
            pright, pn = pright + int(((pl > 0).float().numpy() == t).sum()), pn + len(t)
    want = np.mean(losses, axis=0)
    assert np.allclose([got["val_loss"], got["val_filter_loss"], got["val_pair_loss"]], want, rtol=1e-5, atol=1e-7)
    assert got["val_filter_accuracy"] == right / n and got["val_pair_accuracy"] == pright / max(pn, 1)


def test_fixed_epochs_train_that_many_epochs_on_every_question(data):
    train = gids_of(data, "train")
    model = mtl.fit_mtl(
        data,
        train,
        tiny_config(max_epochs=9, patience=1, fixed_epochs=3),
        mtl.builder_factory(["metadata"], 2)(),
        seed=2,
    )
    # no inner split: no validation loss, no early stop, the last epoch's weights
    assert [h["epoch"] for h in model.history] == [1, 2, 3] and model.best_epoch == 3
    assert not any("val_loss" in h for h in model.history)
    # the feature scaling saw every training question (an inner split would have held some out)
    cand = data.cand[data.cand["gid"].isin(set(train))]
    assert np.allclose(model.builder.mean_, mtl.builder_factory(["metadata"], 2)().fit(cand).mean_)


def test_test_rows_cannot_be_trained_on(data):
    with pytest.raises(MedrankError, match="without a label"):
        mtl.fit_mtl(data, gids_of(data, "test"), tiny_config(max_epochs=1), mtl.builder_factory(["metadata"], 2)())


def test_save_load_round_trip(data, tmp_path):
    model = mtl.fit_mtl(
        data,
        gids_of(data, "train"),
        tiny_config(max_epochs=2),
        mtl.builder_factory(["metadata", "rqe", "anli"], 2)(),
        seed=1,
    )
    model.save(tmp_path / "m", extra_meta={"decision": {"ensemble": "sum"}})
    model.save(tmp_path / "again", extra_meta={"decision": {"ensemble": "sum"}})
    for name in ("model.pt", "mtl.json"):  # same model, same bytes (torch.save used to embed the temp file's name)
        assert (tmp_path / "m" / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name
    loaded, meta = mtl.FittedMTL.load(tmp_path / "m")
    assert meta["decision"] == {"ensemble": "sum"}
    f1, p1 = model.predict(data)
    f2, p2 = loaded.predict(data)
    assert np.allclose(f1["prob"], f2["prob"], atol=1e-6) and np.allclose(p1["prob"], p2["prob"], atol=1e-6)
    with pytest.raises(MedrankError, match="no trained MTL model"):
        mtl.FittedMTL.load(tmp_path / "missing")


def _doctor_mtl_json(text: str) -> list[str]:
    meta = json.loads(text)
    dims = {**meta["dims"], "meta_dim": meta["dims"]["meta_dim"] + 1}
    return [
        text[: len(text) // 2],  # torn write
        "",
        json.dumps({k: v for k, v in meta.items() if k != "builder"}),  # incomplete
        json.dumps({**meta, "config": {**meta["config"], "alpha": "two"}}),
        json.dumps({**meta, "dims": dims}),  # the weights no longer fit the network
        json.dumps({**meta, "pf_mean": "x"}),
        json.dumps([1, 2]),
    ]


def test_corrupt_model_folder_is_one_error_line(data, tmp_path):
    model = mtl.fit_mtl(
        data, gids_of(data, "train"), tiny_config(max_epochs=1), mtl.builder_factory(["metadata"], 2)(), seed=1
    )
    model.save(tmp_path / "m")
    good = (tmp_path / "m" / "mtl.json").read_text()
    for i, text in enumerate([*_doctor_mtl_json(good), "\udcff"]):  # as edited: the seal refuses each
        (tmp_path / "m" / "mtl.json").write_bytes(text.encode("utf-8", "surrogateescape"))
        with pytest.raises(MedrankError, match=r"mtl\.json: (cannot read|not a JSON object|edited or damaged)") as e:
            mtl.FittedMTL.load(tmp_path / "m")
        assert "\n" not in str(e.value) and "dvc repro analysis/dvc.yaml:mtl" in str(e.value), i
    for i, text in enumerate(_doctor_mtl_json(good)[2:-1]):  # re-sealed (valid JSON objects): each still one line
        body = {k: v for k, v in json.loads(text).items() if k != RECORD_SHA256}
        write_sealed_json(tmp_path / "m" / "mtl.json", body)
        with pytest.raises(MedrankError, match="not a model folder the mtl stage writes") as e:
            mtl.FittedMTL.load(tmp_path / "m")
        assert "\n" not in str(e.value), i
    (tmp_path / "m" / "mtl.json").write_text(good)
    weights = (tmp_path / "m" / "model.pt").read_bytes()
    flipped = bytearray(weights)
    flipped[len(weights) // 2] ^= 0x01  # one bit inside a tensor: a valid zip that loads, with other rankings
    for torn in (weights[: len(weights) // 2], b"", b"not a zip", bytes(flipped)):
        (tmp_path / "m" / "model.pt").write_bytes(torn)
        with pytest.raises(
            MedrankError,
            match="not a model folder the mtl stage writes .*model.pt differs from mtl.json's model_sha256",
        ):
            mtl.FittedMTL.load(tmp_path / "m")
    (tmp_path / "m" / "model.pt").write_bytes(weights)
    write_sealed_json(
        tmp_path / "m" / "mtl.json",
        {k: v for k, v in json.loads(good).items() if k not in ("model_sha256", RECORD_SHA256)},
    )
    with pytest.raises(MedrankError, match="no model_sha256 in mtl.json"):
        mtl.FittedMTL.load(tmp_path / "m")


def test_seed_bag_averages_its_members_and_round_trips(data, tmp_path):
    cfg = tiny_config(max_epochs=2, n_seeds=2)
    bag = mtl.fit_mtl_bag(data, gids_of(data, "train"), cfg, mtl.builder_factory(["metadata"], 2), seed=4)
    assert len(bag.members) == 2 and len(bag.best_epoch) == 2
    val = gids_of(data, "val")
    (fa, pa_), (fb, pb) = (m.predict(data, val) for m in bag.members)
    assert not np.allclose(fa["prob"], fb["prob"])  # different seeds, different networks
    f, p = bag.predict(data, val)
    np.testing.assert_allclose(f["prob"], (fa["prob"] + fb["prob"]) / 2)
    np.testing.assert_allclose(p["prob"], (pa_["prob"] + pb["prob"]) / 2)
    bag.save(tmp_path / "bag", extra_meta={"decision": {"ensemble": "mean"}})
    loaded, meta = mtl.MTLBag.load(tmp_path / "bag")
    assert meta["n_members"] == 2 and meta["decision"] == {"ensemble": "mean"}
    np.testing.assert_allclose(loaded.predict(data, val)[0]["prob"], f["prob"], atol=1e-6)
    # a single-network folder (FittedMTL.save) loads as a bag of one
    bag.members[0].save(tmp_path / "one")
    assert len(mtl.MTLBag.load(tmp_path / "one")[0].members) == 1


def test_recipe_outputs_predictions_metrics_and_thresholds(data, tmp_path):
    from medrank.core.io import write_parquet

    sources = ("train_liveqa", "train_alexa", "val")
    cfg, builder = tiny_config(max_epochs=3, cv_folds=2, ensemble="mean"), mtl.builder_factory(["metadata"], 2)
    args = (data, gids_of(data, "train"), gids_of(data, "val"), gids_of(data, "test"), cfg, builder)
    report = mtl.run_recipe(*args, seed=1, sources=sources, workers=2)
    write_parquet(report.predictions, tmp_path / "p.parquet", mtl.PREDICTIONS_SCHEMA)
    pred = report.predictions
    assert set(pred["part"]) == {"oof", "loso", "val", "test"}
    # leave-one-source-out: every labelled row once, its fold the index of its source
    loso = pred[pred["part"] == "loso"]
    assert len(loso) == (pred["part"] == "oof").sum()
    assert (
        loso["fold"].to_numpy() == loso["split"].map({"train_liveqa": 0, "train_alexa": 1, "val": 2}).to_numpy()
    ).all()
    assert set(report.metrics["loso"]["by_source"]) == {"train_liveqa", "train_alexa", "val"}
    assert report.metrics["loso"]["accuracy"]["worst"] <= report.metrics["loso"]["accuracy"]["mean"]
    assert "seed_spread" not in report.metrics  # stage noise_band's, off the experiment path
    assert (pred["part"] == "oof").sum() == data.cand["split"].isin(["train_liveqa", "train_alexa", "val"]).sum()
    assert (pred["part"] == "test").sum() == (data.cand["split"] == "test").sum()
    m = report.metrics
    assert set(m["cv"]) >= {"accuracy", "precision", "mrr", "spearman", "spearman_true", "thresholds"}
    assert len(m["cv"]["thresholds"]) == 2 and 0 < m["decision"]["threshold_final_model"] < 1
    assert "sum/pairwise" in m["cv_variants"] and 0 <= m["val"]["accuracy"] <= 1
    assert m["seconds"]["workers"] == 2 and m["seconds"]["fits_sum"] >= m["seconds"]["cv_folds"][0]
    # the LOSO fold holding out `val` trains on exactly the training questions: it is the train-only model (no own fit)
    labelled = mtl.labelled_gids(data, gids_of(data, "train"), gids_of(data, "val"))
    system = mtl.MTLSystem(data, cfg, builder)
    loso_jobs = system.jobs(LOSO(sources, seed=1).tasks(system.questions(labelled)))
    assert set(loso_jobs[2].train) == set(gids_of(data, "train")) and set(loso_jobs[2].predict) == set(
        gids_of(data, "val")
    )
    alone = fit_many(data, [replace(loso_jobs[2], keep_model=True)])[0].model
    for ta, tb in zip(
        alone.members[0].net.state_dict().values(), report.val_model.members[0].net.state_dict().values()
    ):
        assert torch.equal(ta, tb)
    # 2 processes give the bits of 1: every fit seeds itself (predictions, metrics, the saved weights)
    serial = mtl.run_recipe(*args, seed=1, sources=sources, workers=1)
    pd.testing.assert_frame_equal(serial.predictions, pred)
    assert {k: v for k, v in serial.metrics.items() if k != "seconds"} == {k: v for k, v in m.items() if k != "seconds"}
    # the noise band's spread re-runs the recipe's own CV and LOSO fits: its first seed is this report's figures
    spread = mtl.spread_over_seeds(data, labelled, cfg, builder, seeds=[1, 2], sources=sources, workers=2)
    second = mtl.run_recipe(*args, seed=2, sources=sources, workers=2).metrics
    assert spread == E.seed_spread([(m["cv"], m["loso"]), (second["cv"], second["loso"])]) and spread["seeds"] == 2
    for a, b in ((serial.final_model, report.final_model), (serial.val_model, report.val_model)):
        for ta, tb in zip(a.members[0].net.state_dict().values(), b.members[0].net.state_dict().values()):
            assert torch.equal(ta, tb)
    # ablation rows: CV + LOSO on the default's folds; the default's own config as a row reproduces its numbers
    no_grid = (
        tiny_config(max_epochs=3, nli_grid=False, cv_folds=2, ensemble="sum"),
        mtl.builder_factory(["metadata", "rqe"], 2),
    )
    table = mtl.ablation_cv(
        data,
        mtl.labelled_gids(data, args[1], args[2]),
        {"default": (cfg, builder), "no_grid": no_grid},
        k=2,
        seed=1,
        sources=sources,
        workers=2,
    )
    assert (
        table["default"]["accuracy"] == m["cv"]["accuracy"]
        and table["default"]["loso"]["accuracy"] == m["loso"]["accuracy"]
    )
    row = table["no_grid"]
    assert 0 <= row["accuracy"]["mean"] <= 1 and len(row["thresholds"]) == 2 and row["accuracy"] != m["cv"]["accuracy"]
    assert row["loso"]["accuracy"]["worst"] <= row["loso"]["accuracy"]["mean"] and row["seconds"] > 0
    # kept answers come first within each question in the test part
    for _, g in pred[pred["part"] == "test"].groupby("qid"):
        labels = g.sort_values("score", ascending=False)["label"].tolist()
        assert labels == sorted(labels, reverse=True)


# ---------------------------------------------------------------- final system: ensemble with the baseline, error analysis


def _cand():
    return pd.DataFrame(
        {
            "gid": ["v:1"] * 3 + ["v:2"] * 3,
            "split": "val",
            "qid": ["1"] * 3 + ["2"] * 3,
            "aid": ["a", "b", "c", "d", "e", "f"],
            "label": [1.0, 1.0, 0.0, 1.0, 0.0, 0.0],
            "reference_rank": [1.0, 2.0, 3.0, 1.0, 2.0, 3.0],
            "reference_score": [4.0, 3.0, 1.0, 4.0, 2.0, 1.0],
            "chiqa_rank": [2.0, 1.0, 3.0, 1.0, 2.0, 3.0],
            "n_sentences": [3.0, 12.0, 100.0, 1.0, 7.0, 25.0],
        }
    )


def test_combine_systems_averages_probabilities_and_within_question_ranks():
    a = pd.DataFrame(
        {
            "part": "val",
            "gid": ["q"] * 3,
            "aid": ["x", "y", "z"],
            "fold": -1,
            "prob": [0.9, 0.5, 0.1],
            "rank_key": [3.0, 2.0, 1.0],
        }
    )
    b = pd.DataFrame(
        {
            "part": "val",
            "gid": ["q"] * 3,
            "aid": ["z", "y", "x"],
            "prob": [0.3, 0.7, 0.5],
            "rank_key": [-1.0, 10.0, 0.0],
        }
    )
    c = D.combine_systems(a, b, 0.5).set_index("aid")
    assert c.loc["x", "prob"] == pytest.approx(0.7) and c.loc["z", "prob"] == pytest.approx(0.2)
    # ranks scaled to (0, 1]: x = (1 + 2/3) / 2, y = (2/3 + 1) / 2, z = (1/3 + 1/3) / 2
    assert c.loc["x", "rank_key"] == pytest.approx(5 / 6) and c.loc["z", "rank_key"] == pytest.approx(1 / 3)
    with pytest.raises(MedrankError, match="no prediction of the other system"):
        D.combine_systems(a, b.iloc[:2], 0.5)
    assert len(D.combine_systems(a.iloc[:2], b, 0.5)) == 2  # the other system may cover more answers


def test_decide_system_thresholds_from_other_folds_only():
    cand = _cand()
    rows = pd.DataFrame(
        {
            "part": ["oof"] * 6 + ["val"] * 6,
            "gid": list(cand["gid"]) * 2,
            "aid": list(cand["aid"]) * 2,
            "fold": [0, 0, 0, 1, 1, 1] + [-1] * 6,
            "prob": [0.9, 0.8, 0.2, 0.6, 0.4, 0.1] * 2,
            "rank_key": [3.0, 2.0, 1.0, 3.0, 2.0, 1.0] * 2,
        }
    )
    thresholds, dec = D.decide_system(rows, cand, train=["v:1", "v:2"])
    summary = E.cv_summary_of(dec, cand)
    t0, t1 = (k["value"] for k in thresholds["folds"])
    # fold 0's threshold separates fold 1's rows (0.6 valid vs 0.4) and vice versa
    assert 0.4 < t0 <= 0.6 and 0.2 < t1 <= 0.8
    assert summary["accuracy"]["mean"] == pytest.approx(1.0)
    val = dec[dec["part"] == "val"].set_index("aid")
    assert list(val["label"]) == [1, 1, 0, 1, 0, 0]


def test_error_analysis_tables():
    cand = _cand()
    dec = cand[["gid", "aid"]].assign(part="val", label=[1, 0, 0, 1, 1, 0], score=[2.0, 0.5, 0.1, 2.0, 1.5, 0.2])
    figs = E.error_analysis(dec, cand)
    fig7 = figs["recall_by_chiqa_rank"].set_index("chiqa_rank")
    # valid answers: a (rank 2, kept), b (rank 1, dropped), d (rank 1, kept)
    assert fig7.loc[1, "recall"] == pytest.approx(0.5) and fig7.loc[1, "n"] == 2 and fig7.loc[2, "recall"] == 1.0
    fig8 = figs["accuracy_by_sentences"]
    assert list(fig8["n"]) == [2, 1, 1, 1, 1] and list(fig8["sentences"])[::4] == ["0-5 (2)", ">80 (1)"]
    fig9 = figs["by_valid_answers"].set_index("n_valid")
    # question 1 has 2 valid answers (1 kept: rho taken as 0), question 2 has 1 valid
    assert fig9.loc[2, "accuracy"] == pytest.approx(2 / 3) and fig9.loc[1, "accuracy"] == pytest.approx(2 / 3)
    assert fig9.loc[2, "spearman"] == 0.0 and list(fig9["n"]) == [1, 1]
