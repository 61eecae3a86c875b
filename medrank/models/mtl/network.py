"""The MTL network (paper §4.5, Appendix Tables 7-8): a conv encoder over the NLI sentence-pair grid, the joint
embedding (grid vector, projected RQE vector, metadata, pair values), a filter head and an antisymmetric pairwise head."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from medrank.core.errors import MedrankError

if TYPE_CHECKING:
    from medrank.params import MtlParams


class MaskedBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm over the valid cells only (grids are zero-padded to a common size within a batch)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self.training:
            n = mask.sum().clamp(min=2.0)
            mean = (x * mask).sum(dim=(0, 2, 3)) / n
            var = (((x - mean[None, :, None, None]) ** 2) * mask).sum(dim=(0, 2, 3)) / n
            with torch.no_grad():
                m = self.momentum if self.momentum is not None else 0.1
                self.running_mean.mul_(1 - m).add_(m * mean.detach())
                self.running_var.mul_(1 - m).add_(m * var.detach() * n / (n - 1))
                self.num_batches_tracked += 1
        else:
            mean, var = self.running_mean, self.running_var
        y = (x - mean[None, :, None, None]) * torch.rsqrt(var[None, :, None, None] + self.eps)
        y = y * self.weight[None, :, None, None] + self.bias[None, :, None, None]
        return y * mask


# Appendix Table 8 after the 1×1 projection: (kernel, stride, padding, batch norm, ReLU); widths are params.
# The last conv is the output layer (no ReLU, as in the paper).
CONV_SPEC = ((3, 1, 2, True, True), (3, 2, 1, False, True), (2, 1, 1, True, True), (3, 1, 2, False, False))


def _out_size(n: torch.Tensor, k: int, s: int, p: int) -> torch.Tensor:
    return torch.div(n + 2 * p - k, s, rounding_mode="floor") + 1


def _mask(h: torch.Tensor, w: torch.Tensor, H: int, W: int) -> torch.Tensor:
    rows = torch.arange(H, device=h.device)[None, :] < h[:, None]
    cols = torch.arange(W, device=w.device)[None, :] < w[:, None]
    return (rows[:, :, None] & cols[:, None, :]).unsqueeze(1).float()


def quadrant_pool(x: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Average of each quadrant of the valid (h, w) region of x (B, C, H, W) → (B, 4C).

    Odd sides share their middle row/column between both halves, so every quadrant is non-empty.
    """
    B, C, H, W = x.shape
    r = torch.arange(H, device=x.device)[None, :]
    c = torch.arange(W, device=x.device)[None, :]
    top = r < torch.div(h + 1, 2, rounding_mode="floor")[:, None]
    bottom = (r >= torch.div(h, 2, rounding_mode="floor")[:, None]) & (r < h[:, None])
    left = c < torch.div(w + 1, 2, rounding_mode="floor")[:, None]
    right = (c >= torch.div(w, 2, rounding_mode="floor")[:, None]) & (c < w[:, None])
    quads = []
    for rm in (top, bottom):
        for cm in (left, right):
            m = (rm[:, :, None] & cm[:, None, :]).float().unsqueeze(1)  # B,1,H,W
            quads.append((x * m).sum(dim=(2, 3)) / m.sum(dim=(2, 3)).clamp(min=1.0))
    return torch.cat(quads, dim=1)


class GridEncoder(nn.Module):
    """Conv encoder of Appendix Table 8 over a batch of variable-size grids → (B, 4 × last width).

    The 1×1 projection runs on the packed valid cells (its padding in the paper only adds a frame of
    bias values); the rest runs on zero-padded maps with masks tracked through each conv's arithmetic,
    so a grid's vector does not depend on what it is batched with (in eval mode).
    """

    def __init__(self, hidden_size: int, proj_channels: int, conv_channels: Sequence[int]) -> None:
        super().__init__()
        if len(conv_channels) != len(CONV_SPEC):
            raise MedrankError(f"conv_channels needs {len(CONV_SPEC)} widths (Table 8), got {list(conv_channels)}")
        self.proj = nn.Linear(hidden_size, proj_channels)
        self.proj_bn = nn.BatchNorm1d(proj_channels)
        self.convs = nn.ModuleList()
        self.bns = nn.ModuleList()
        c_in = proj_channels
        for c_out, (k, s, p, bn, _) in zip(conv_channels, CONV_SPEC):
            self.convs.append(nn.Conv2d(c_in, c_out, k, stride=s, padding=p))
            self.bns.append(MaskedBatchNorm2d(c_out) if bn else nn.Identity())
            c_in = c_out
        self.out_dim = 4 * int(conv_channels[-1])

    def forward(self, cells: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """cells: (Σ h_i·w_i, hidden) rows of each grid in row-major order, grid after grid."""
        z = self.proj_bn(self.proj(cells))
        B, C = len(h), z.shape[1]
        Hm, Wm = int(h.max()), int(w.max())
        mask = _mask(h, w, Hm, Wm)  # B,1,H,W
        x = z.new_zeros(B, Hm, Wm, C)
        x[mask[:, 0].bool()] = z  # boolean-mask assignment fills in row-major order, matching `cells`
        x = x.permute(0, 3, 1, 2).contiguous()
        for conv, bn, (k, s, p, use_bn, relu) in zip(self.convs, self.bns, CONV_SPEC):
            x = conv(x)
            h, w = _out_size(h, k, s, p), _out_size(w, k, s, p)
            mask = _mask(h, w, x.shape[2], x.shape[3])
            x = bn(x, mask) if use_bn else x * mask
            if relu:
                x = F.relu(x)
        return quadrant_pool(x, h, w)


def _mlp(d_in: int, hidden: Sequence[int], dropout: float) -> nn.Sequential:
    """Table 7 style: Linear + BN + ReLU (+ dropout) per hidden layer, then Linear → 1 logit."""
    layers: list[nn.Module] = []
    for d in hidden:
        layers += [nn.Linear(d_in, d), nn.BatchNorm1d(d), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        d_in = d
    layers.append(nn.Linear(d_in, 1))
    return nn.Sequential(*layers)


class MTLNet(nn.Module):
    """Joint embedding (grid vector, projected RQE vector, metadata, pair values) + filter and pairwise heads."""

    def __init__(self, cfg: MtlParams, hidden_size: int, rqe_size: int, meta_dim: int, pair_dim: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.encoder = GridEncoder(hidden_size, cfg.proj_channels, cfg.conv_channels) if cfg.nli_grid else None
        self.rqe_proj = nn.Linear(rqe_size, cfg.rqe_dim) if cfg.rqe_dim > 0 and rqe_size > 0 else None
        self.joint_dim = (
            (self.encoder.out_dim if self.encoder is not None else 0)
            + (cfg.rqe_dim if self.rqe_proj is not None else 0)
            + meta_dim
            + pair_dim
        )
        self.filter_head = _mlp(self.joint_dim, cfg.filter_hidden, cfg.dropout)
        self.pair_head = _mlp(2 * self.joint_dim, cfg.pair_hidden, cfg.dropout)

    def joint(self, cells, h, w, rqe, meta, pf) -> torch.Tensor:
        parts = [self.encoder(cells, h, w)] if self.encoder is not None else []
        if self.rqe_proj is not None:
            parts.append(self.rqe_proj(rqe))
        parts += [meta, pf]
        return torch.cat(parts, dim=1)

    def filter_logits(self, joint: torch.Tensor) -> torch.Tensor:
        return self.filter_head(joint).squeeze(1)

    def pair_logits(self, joint: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Logit of "row i ranks above row j"; antisymmetric by construction (swap → negated logit)."""
        if len(i) == 0:
            return joint.new_zeros(0)
        both = torch.cat([torch.cat([joint[i], joint[j]], 1), torch.cat([joint[j], joint[i]], 1)], 0)
        g = self.pair_head(both).squeeze(1)
        return g[: len(i)] - g[len(i) :]


def mtl_loss(
    filter_logits: torch.Tensor,
    labels: torch.Tensor,
    pair_logits: torch.Tensor,
    pair_targets: torch.Tensor,
    alpha: float,
    n_questions: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, filter, pair): Σ BCE_filter + α Σ BCE_pair over the batch, divided by its number of questions."""
    lf = F.binary_cross_entropy_with_logits(filter_logits, labels, reduction="sum")
    lp = (
        F.binary_cross_entropy_with_logits(pair_logits, pair_targets, reduction="sum")
        if len(pair_logits)
        else filter_logits.new_zeros(())
    )
    n = max(n_questions, 1)
    return (lf + alpha * lp) / n, lf / n, lp / n
