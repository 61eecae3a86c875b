"""A fitted MTL: the network with its feature builder and pair-value scaling (FittedMTL: predict, save/load as state
dict + JSON, no pickles), seed bags of them (MTLBag), and the batching of pair rows into grid tensors both use."""

from __future__ import annotations

import logging
import pickle
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from medrank.core.errors import MedrankError
from medrank.task3.features import builder_from_json, builder_to_json
from medrank.models.mtl.data import PAIR_FEATURES, MTLData
from medrank.models.mtl.network import MTLNet
from medrank.params import MtlParams

log = logging.getLogger(__name__)

MAX_CELLS_PER_CHUNK = 40000  # padded grid cells encoded at once (memory bound)


def pair_index(groups: np.ndarray, ranks: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, target) for every unordered pair of rows in the same group; target 1 if i ranks above j.

    ranks: reference rank (lower = better) or None at inference (target 0, unused). Without ranks every
    pair i < j is returned; with ranks, pairs of equal rank are skipped. Groups in order of first appearance, rows
    ascending within a group.
    """
    codes = pd.factorize(np.asarray(groups))[0]  # group ids in order of first appearance
    order = np.argsort(codes, kind="stable")  # by group, rows ascending within it
    sizes = np.bincount(codes) if len(codes) else np.zeros(0, np.int64)
    # every group's (a, b) with a < b < its size, row-major: the (a, b) of triu(largest size) with b < size, in order
    a, b = np.triu_indices(int(sizes.max()) if len(sizes) else 0, k=1)
    keep = b[None, :] < sizes[:, None]  # (groups, pairs of the largest group)
    if not keep.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    start = (np.cumsum(sizes) - sizes)[:, None]  # each group's first position in `order`
    i, j = order[(start + a[None, :])[keep]], order[(start + b[None, :])[keep]]
    if ranks is None:
        return i, j, np.zeros(len(i), np.float32)
    keep = ranks[i] != ranks[j]
    i, j = i[keep], j[keep]
    return i, j, (ranks[i] < ranks[j]).astype(np.float32)


@dataclass
class PreparedRows:
    """Per-pair-row arrays for the model: metadata rows, standardised pair values, labels, ranks, groups."""

    meta: np.ndarray
    pf: np.ndarray
    labels: np.ndarray
    ranks: np.ndarray
    groups: np.ndarray  # "gid\0entailed": pairwise comparisons happen within a group


class Batcher:
    def __init__(self, data: MTLData, prep: PreparedRows, device: torch.device, max_cells: int) -> None:
        self.data, self.prep, self.device, self.max_cells = data, prep, device, max_cells

    def tensors(self, rows: np.ndarray) -> tuple:
        grids32 = self.data.grids32()
        grids = [grids32[r] for r in rows]
        h = torch.tensor([g.shape[0] for g in grids], dtype=torch.long)
        w = torch.tensor([g.shape[1] for g in grids], dtype=torch.long)
        cells = torch.from_numpy(np.concatenate([g.reshape(-1, g.shape[2]) for g in grids]))
        to = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(self.device)
        return (
            cells.to(self.device),
            h.to(self.device),
            w.to(self.device),
            to(self.data.rqe[rows]),
            to(self.prep.meta[rows]),
            to(self.prep.pf[rows]),
        )

    def joint(self, net: MTLNet, rows: np.ndarray) -> torch.Tensor:
        """Joint embeddings of `rows` (in order), grids encoded in size-sorted chunks to limit padding."""
        order = sorted(
            range(len(rows)), key=lambda k: (self.data.grids[rows[k]].shape[0], self.data.grids[rows[k]].shape[1])
        )
        chunks: list[list[int]] = [[]]
        hmax = wmax = 0
        for k in order:
            a, c = self.data.grids[rows[k]].shape[:2]
            nh, nw = max(hmax, a), max(wmax, c)
            if chunks[-1] and nh * nw * (len(chunks[-1]) + 1) > self.max_cells:
                chunks.append([])
                nh, nw = a, c
            chunks[-1].append(k)
            hmax, wmax = nh, nw
        pieces = []
        for ch in chunks:
            sub = rows[np.asarray(ch)]
            pieces.append((ch, net.joint(*self.tensors(sub))))
        dim = pieces[0][1].shape[1]
        joint = pieces[0][1].new_empty(len(rows), dim)
        for ch, j in pieces:
            joint[torch.as_tensor(ch, device=joint.device)] = j
        return joint


# ---------------------------------------------------------------- fitted model


@dataclass
class FittedMTL:
    """A trained network with the feature builder and pair-value scaling it was trained with."""

    config: MtlParams
    net: MTLNet
    builder: object  # medrank.task3.features.FeatureBuilder
    pf_mean: np.ndarray
    pf_scale: np.ndarray
    history: list[dict] = field(default_factory=list)
    best_epoch: int = 0

    def prepare(self, data: MTLData) -> PreparedRows:
        return prepare_rows(data, self.builder, self.pf_mean, self.pf_scale)

    @torch.no_grad()
    def predict(
        self, data: MTLData, gids: Sequence[str] | None = None, device: str | torch.device = "cpu"
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Per-(candidate, entailed) filter probabilities and per-ordered-pair P(i above j), non-augmented rows.

        Returns (filter_df: gid, aid, entailed, prob; pair_df: gid, entailed, aid_i, aid_j, prob) with both
        orders of each pair (prob_ji = 1 - prob_ij).
        """
        dev = torch.device(device) if not isinstance(device, torch.device) else device
        gids = list(pd.unique(data.cand["gid"])) if gids is None else list(gids)
        rows = data.pair_rows(gids, augmented=False)
        self.net.to(dev).eval()
        prep = self.prepare(data)
        batcher = Batcher(data, prep, dev, MAX_CELLS_PER_CHUNK)
        aid = data.cand["aid"].to_numpy()[data.pairs["cand"].to_numpy()]
        f_parts, p_parts = [], []
        # a few questions at a time keeps memory flat on large inputs
        by_q = pd.Series(rows).groupby(data.pairs["gid"].to_numpy()[rows], sort=False).indices
        qs = list(by_q)
        for s in range(0, len(qs), 16):
            sub = np.concatenate([rows[by_q[q]] for q in qs[s : s + 16]]) if qs else rows
            joint = batcher.joint(self.net, sub)
            prob = torch.sigmoid(self.net.filter_logits(joint)).cpu().numpy()
            f_parts.append(
                pd.DataFrame(
                    {
                        "gid": data.pairs["gid"].to_numpy()[sub],
                        "aid": aid[sub],
                        "entailed": data.pairs["entailed"].to_numpy()[sub],
                        "prob": prob,
                    }
                )
            )
            i, j, _ = pair_index(prep.groups[sub], None)
            if len(i):
                pij = (
                    torch.sigmoid(
                        self.net.pair_logits(joint, torch.as_tensor(i, device=dev), torch.as_tensor(j, device=dev))
                    )
                    .cpu()
                    .numpy()
                )
                g = data.pairs["gid"].to_numpy()[sub]
                e = data.pairs["entailed"].to_numpy()[sub]
                a = aid[sub]
                p_parts.append(pd.DataFrame({"gid": g[i], "entailed": e[i], "aid_i": a[i], "aid_j": a[j], "prob": pij}))
                p_parts.append(
                    pd.DataFrame({"gid": g[i], "entailed": e[i], "aid_i": a[j], "aid_j": a[i], "prob": 1.0 - pij})
                )
        fcols = ["gid", "aid", "entailed", "prob"]
        pcols = ["gid", "entailed", "aid_i", "aid_j", "prob"]
        f_df = pd.concat(f_parts, ignore_index=True) if f_parts else pd.DataFrame(columns=fcols)
        p_df = pd.concat(p_parts, ignore_index=True) if p_parts else pd.DataFrame(columns=pcols)
        return f_df, p_df

    # ------------------------------------------------------------ persistence
    def save(self, out_dir: str | Path, extra_meta: dict | None = None) -> None:
        """model.pt (state dict only) + mtl.json (config, dims, feature builder state, pair-value scaling)."""
        from medrank.core.io import atomic_path, sha256_file, write_sealed_json

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        # to a file object: given a path, torch names the zip's root folder after it (the random temp name), and
        # the same tensors would give other bytes on every run
        with atomic_path(out_dir / "model.pt") as tmp, open(tmp, "wb") as f:
            torch.save({k: v.detach().cpu() for k, v in self.net.state_dict().items()}, f)
        meta = {
            "model_sha256": sha256_file(out_dir / "model.pt"),  # checked at every load: flipped bytes are refused
            "config": self.config.model_dump(mode="json"),
            "dims": self.dims,
            "builder": builder_to_json(self.builder),
            "pf_mean": self.pf_mean.tolist(),
            "pf_scale": self.pf_scale.tolist(),
            "best_epoch": self.best_epoch,
            # the curves without their wall seconds: the saved folder is the same bytes on every run (plots/mtl has them)
            "history": [{k: v for k, v in h.items() if k != "seconds"} for h in self.history],
            **(extra_meta or {}),
        }
        write_sealed_json(out_dir / "mtl.json", meta)  # record_sha256: an edited scaling or rule is refused at load

    @property
    def dims(self) -> dict:
        return {
            "hidden_size": self.net.hidden_size,
            "rqe_size": self.net.rqe_proj.in_features if self.net.rqe_proj is not None else 0,
            "meta_dim": len(self.builder.feature_names),
            "pair_dim": len(PAIR_FEATURES),
        }

    @classmethod
    def load(cls, path: str | Path) -> tuple["FittedMTL", dict]:
        """(model, its mtl.json metadata) from a folder written by `save`."""
        path = Path(path)
        if not (path / "model.pt").exists() or not (path / "mtl.json").exists():
            raise MedrankError(f"{path}: no trained MTL model (model.pt + mtl.json; run the mtl stage)")
        from medrank.core.io import read_sealed_json, sha256_file

        meta = read_sealed_json(
            path / "mtl.json", "re-run `dvc repro analysis/dvc.yaml:mtl`, or `dvc checkout analysis/dvc.yaml:mtl`"
        )
        try:  # a truncated or doctored model folder is one line naming it, not a traceback
            if meta.get("model_sha256") != sha256_file(path / "model.pt"):  # flipped tensor bytes load fine otherwise
                raise ValueError(
                    "no model_sha256 in mtl.json"
                    if "model_sha256" not in meta
                    else "model.pt differs from mtl.json's model_sha256"
                )
            cfg = MtlParams.model_validate(meta["config"])
            net = MTLNet(cfg, **meta["dims"])
            state = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
            net.load_state_dict(state)
            fitted = cls(
                cfg,
                net.eval(),
                builder_from_json(meta["builder"]),
                np.asarray(meta["pf_mean"], dtype=float),
                np.asarray(meta["pf_scale"], dtype=float),
                meta.get("history", []),
                meta.get("best_epoch", 0),
            )
        except (
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
            RuntimeError,
            EOFError,
            OSError,
            pickle.UnpicklingError,
            zipfile.BadZipFile,
        ) as e:
            # ValueError covers JSON, UTF-8 and pydantic errors; RuntimeError a state dict of other shapes or a torn model.pt
            reason = str(e).splitlines()[0][:200] if str(e) else ""
            raise MedrankError(
                f"{path}: not a model folder the mtl stage writes ({type(e).__name__}: {reason}); re-run `dvc repro analysis/dvc.yaml:mtl` or `dvc checkout analysis/dvc.yaml:mtl`"
            ) from None
        return fitted, meta


@dataclass
class MTLBag:
    """Networks of one recipe trained with different seeds; predictions are their mean (variance reduction)."""

    members: list[FittedMTL]

    @property
    def builder(self):
        return self.members[0].builder

    @property
    def best_epoch(self) -> list[int]:
        return [m.best_epoch for m in self.members]

    @property
    def history(self) -> list[dict]:
        """The first member's curves (what dvclive plots)."""
        return self.members[0].history

    def predict(
        self, data: MTLData, gids: Sequence[str] | None = None, device: str | torch.device = "cpu"
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """FittedMTL.predict of every member, probabilities averaged (members return rows in the same order)."""
        outs = [m.predict(data, gids, device) for m in self.members]
        f_df, p_df = outs[0][0].copy(), outs[0][1].copy()
        if len(outs) > 1:
            f_df["prob"] = np.mean([o[0]["prob"].to_numpy() for o in outs], axis=0)
            p_df["prob"] = np.mean([o[1]["prob"].to_numpy() for o in outs], axis=0)
        return f_df, p_df

    def save(self, out_dir: str | Path, extra_meta: dict | None = None) -> None:
        """The first member as FittedMTL.save (with n_members), the others in member1/, member2/, ..."""
        out_dir = Path(out_dir)
        self.members[0].save(out_dir, {**(extra_meta or {}), "n_members": len(self.members)})
        for i, m in enumerate(self.members[1:], start=1):
            m.save(out_dir / f"member{i}")

    @classmethod
    def load(cls, path: str | Path) -> tuple["MTLBag", dict]:
        """(bag, the first member's mtl.json) from a folder written by `save` (or by FittedMTL.save: one member)."""
        first, meta = FittedMTL.load(path)
        members = [first] + [
            FittedMTL.load(Path(path) / f"member{i}")[0] for i in range(1, int(meta.get("n_members", 1)))
        ]
        return cls(members), meta


def prepare_rows(data: MTLData, builder, pf_mean: np.ndarray, pf_scale: np.ndarray) -> PreparedRows:
    meta_c = builder.transform(data.cand)
    meta_c = np.asarray(meta_c.todense() if hasattr(meta_c, "todense") else meta_c, dtype=np.float32)
    cand = data.pairs["cand"].to_numpy()
    pf = (data.pairs[list(PAIR_FEATURES)].to_numpy(dtype=float) - pf_mean) / pf_scale
    labels = data.cand["label"].to_numpy(dtype=float)[cand]
    ranks = data.cand["reference_rank"].to_numpy(dtype=float)[cand]
    groups = (data.pairs["gid"].astype(str) + "\0" + data.pairs["entailed"].astype(str)).to_numpy()
    return PreparedRows(meta_c[cand], pf.astype(np.float32), labels, ranks, groups)
