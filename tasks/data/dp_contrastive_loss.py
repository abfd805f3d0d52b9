"""Contrastive (CLIP) loss with all-gathered features, each rank scoring its own rows.

Signature: dp_contrastive_loss(image_features: [B, D], text_features: [B, D], logit_scale: [])
           -> {"loss": [] float32, "logits_per_image": [B, n*B]}

Each rank has B image/text pairs, features L2-normalised. The features of all ranks are
all-gathered (rank order); rank r computes logits_per_image = logit_scale * image_r @ all_text.T
and logits_per_text = logit_scale * text_r @ all_image.T, whose correct classes are its own pairs,
columns r*B .. (r+1)*B - 1, and returns the mean of the two cross-entropies (float32) and
logits_per_image (OpenCLIP ClipLoss with local_loss=True; logit_scale is already exponentiated).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, accumulate_dtype, bus_factor

TASK = TaskSpec(
    id="dp_contrastive_loss",
    title="CLIP contrastive loss over all-gathered features",
    family="data",
    source="OpenCLIP open_clip/loss.py ClipLoss (gather_features, local_loss=True)",
    why="The batch's negatives come from every rank: two feature all-gathers per step whose cost "
        "grows with the global batch, followed by a GEMM that could start on the first chunk to arrive.",
    sizes={
        "small": {"batch_per_rank": 7, "dim": 12},
        # 1000 pairs per rank (8k global) of ViT-L/14's 768-d embeddings; large: 4000 per rank of 1024-d.
        "default": {"batch_per_rank": 1000, "dim": 768},
        "large": {"batch_per_rank": 4000, "dim": 1024},
    },
    dtypes=("float32", "bfloat16"),
    # logit_scale is drawn in [10, 20] (CLIP starts at 1/0.07 = 14.3), so |logits| <= 20; matched
    # pairs have cosine ~0.7. fp32: D-term dot products of unit vectors, ~1e-6 after scaling. bf16
    # (as OpenCLIP under autocast): scaled features and logits round to bf16, up to one ulp (0.125
    # at 16-32) apart from the once-rounded reference, inside rtol; the float32 cross-entropy
    # averages the logit errors, so the loss stays within ~1e-2.
    tolerances={
        "float32": Tolerance(atol=2e-5, rtol=1e-5),
        "bfloat16": Tolerance(atol=5e-2, rtol=2e-2),
    },
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = ctx.params
    image = ctx.randn(p["batch_per_rank"], p["dim"], stream=0, dtype=torch.float32)
    # Captions resemble their images: matched pairs score well above the negatives.
    text = image + ctx.randn(p["batch_per_rank"], p["dim"], stream=1, dtype=torch.float32)
    scale = 10.0 + 10.0 * torch.rand((), generator=ctx.shared_generator(), device=ctx.device)
    return F.normalize(image, dim=-1).to(ctx.dtype), F.normalize(text, dim=-1).to(ctx.dtype), scale


def baseline(
    image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: torch.Tensor,
) -> dict[str, torch.Tensor]:
    rank, n = dist.get_rank(), dist.get_world_size()
    batch = image_features.shape[0]
    all_image = image_features.new_empty((n * batch, image_features.shape[1]))
    all_text = text_features.new_empty((n * batch, text_features.shape[1]))
    _comm.all_gather_single(all_image, image_features)
    _comm.all_gather_single(all_text, text_features)
    logits_per_image = logit_scale * image_features @ all_text.T
    logits_per_text = logit_scale * text_features @ all_image.T
    labels = torch.arange(batch, device=image_features.device) + rank * batch
    wide = accumulate_dtype(logits_per_image)  # float32 (float64 for the judge's truth)
    loss = (F.cross_entropy(logits_per_image.to(wide), labels) + F.cross_entropy(logits_per_text.to(wide), labels)) / 2
    return {"loss": loss, "logits_per_image": logits_per_image}


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[dict[str, torch.Tensor]]:
    all_image = torch.cat([inputs[0].double() for inputs in inputs_per_rank])
    all_text = torch.cat([inputs[1].double() for inputs in inputs_per_rank])
    out = []
    for rank, (image, text, scale) in enumerate(inputs_per_rank):
        scale = scale.double()
        logits_per_image = scale * image.double() @ all_text.T
        logits_per_text = scale * text.double() @ all_image.T
        labels = torch.arange(image.shape[0]) + rank * image.shape[0]
        loss = (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2
        out.append({"loss": loss.to(accumulate_dtype(ctx.dtype)), "logits_per_image": logits_per_image.to(ctx.dtype)})
    return out


def traffic(ctx: TaskContext) -> Traffic:
    # Every rank needs the other n-1 ranks' image and text features: (n-1) * 2*B*D*b in; a ring
    # all-gather sends as much. FLOPs: two [B, D] x [D, nB] GEMMs (4*B*nB*D) and two
    # cross-entropies (~5 per logit). Memory: write and read the gathered features, write
    # logits_per_image (logits_per_text can stay in registers of a fused kernel).
    p, n, b = ctx.params, ctx.world_size, ctx.dtype.itemsize
    batch, dim = p["batch_per_rank"], p["dim"]
    features_bytes = 2 * batch * dim * b
    wire = (n - 1) * features_bytes
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=features_bytes + 2 * n * features_bytes + batch * n * batch * b,
        flops=4 * batch * n * batch * dim + 10 * batch * n * batch,
        payload_bytes=n * features_bytes, bus_factor=bus_factor("all_gather", n),
    )
