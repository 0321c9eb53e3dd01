"""HuggingFace causal language models end to end, against references that do not use lossgeom.

GPT-2 (``GPT2LMHeadModel``, tied input and output embeddings) and a LLaMA-style model
(``LlamaForCausalLM`` with grouped-query attention: two query heads share one key/value
head) are built from small configs (no download), in float64 and eval mode, with eager
attention, and measured on two right-padded batches of different padding: dict batches
with ``input_ids``, ``attention_mask`` and ``labels`` that are -100 at the padding. The
references are computed here, with autograd on transformers' own loss: its
``ForCausalLMLoss`` shift (the labels padded with -100 and moved one to the left) and its
``fixed_cross_entropy``, on the two batches concatenated into one.

Two findings about transformers, stated by the tests below:

- ``model(**batch).loss`` casts the logits to float32 before the cross-entropy
  (``ForCausalLMLoss`` calls ``logits.float()``), so it agrees with a float64 risk only to
  float32 rounding; the float64 reference is the same shift and ``fixed_cross_entropy``
  without that cast.
- ``LlamaRMSNorm`` computes in float32 even in a float64 model, so the LLaMA Hessian (as
  autograd differentiates it) is symmetric only to about 1e-7 relative, and any two
  float64 computations of its derivatives that sum in another order (two batches against
  one, rows against columns) differ at float32's rounding: every LLaMA comparison with the
  independent references holds to ``RTOL["llama"]`` = 1e-6 (measured: about 1e-7), its
  eigenvalues against those of the reference's symmetric part. GPT-2 is float64
  throughout and meets 1e-10 everywhere.

Sizes: GPT-2 with 204 parameters and LLaMA with 164 (vocabulary 7, width 4), six
sequences of six tokens; the matrix-free case is a GPT-2 of 118,528 parameters.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.func import functional_call

from lossgeom import flatness
from lossgeom.curvature import (
    fisher_operator,
    hessian_operator,
    hutchpp_trace,
    lambda_max,
    top_eigenpairs,
)
from lossgeom.losses import CausalLMLoss
from lossgeom.risk import EmpiricalRisk

transformers = pytest.importorskip("transformers")
from transformers.loss.loss_utils import fixed_cross_entropy  # noqa: E402

VOCAB, LENGTH = 7, 6
#: the lengths of the six sequences, as two batches of three (the rest of each row is padding)
LENGTHS = ([6, 4, 5], [3, 6, 2])
TOL = 1e-10
#: against the independent references: LLaMA's derivatives pass through LlamaRMSNorm's float32
RTOL = {"gpt2": TOL, "llama": 1e-6}


def gpt2(vocab: int = VOCAB, width: int = 4, layers: int = 1, positions: int = 8, inner: int | None = 4):
    config = transformers.GPT2Config(
        vocab_size=vocab,
        n_embd=width,
        n_layer=layers,
        n_head=2,
        n_positions=positions,
        n_inner=inner,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(config)


def llama():
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=4,
        intermediate_size=4,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(config)


def prepared(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Float64, eval mode, and parameters of order one (HuggingFace initialises them at 0.02)."""
    model = model.double().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
    return model


def padded_batches(lengths=LENGTHS, vocab: int = VOCAB, length: int = LENGTH, seed: int = 1) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for rows in lengths:
        ids = torch.randint(0, vocab, (len(rows), length), generator=generator)
        mask = (torch.arange(length)[None] < torch.tensor(rows)[:, None]).long()
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})
    return batches


def concatenated(batches: list[dict]) -> dict:
    return {key: torch.cat([b[key] for b in batches]) for key in batches[0]}


def hf_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' ForCausalLMLoss without its float32 cast: the same shift, its fixed_cross_entropy."""
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    return fixed_cross_entropy(logits.reshape(-1, logits.shape[-1]), shifted.reshape(-1), ignore_index=-100)


class Reference:
    """Dense float64 references by autograd on transformers' loss of the concatenated batch."""

    def __init__(self, model: torch.nn.Module, batches: list[dict]) -> None:
        self.model, self.batch = model, concatenated(batches)
        self.inputs = {k: v for k, v in self.batch.items() if k != "labels"}
        self.labels = self.batch["labels"]
        self.names = [name for name, _ in model.named_parameters()]
        self.shapes = [p.shape for _, p in model.named_parameters()]
        self.theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        self.n = self.theta.numel()
        self.kept = (self.labels[:, 1:] != -100).sum(dim=1)  # next-token targets of each sequence

    def params(self, theta: torch.Tensor) -> dict:
        pieces = torch.split(theta, [int(np.prod(s)) for s in self.shapes])
        return {name: p.reshape(s) for name, p, s in zip(self.names, pieces, self.shapes)}

    def logits(self, theta: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        inputs = {k: v[rows] for k, v in self.inputs.items()}
        return functional_call(self.model, self.params(theta), args=(), kwargs=inputs).logits

    def loss(self, theta: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        return hf_loss(self.logits(theta, rows), self.labels[rows])

    def hessian(self) -> torch.Tensor:
        return torch.autograd.functional.hessian(self.loss, self.theta)

    def gradient(self, theta: torch.Tensor | None = None, rows: slice = slice(None)) -> torch.Tensor:
        leaf = (self.theta if theta is None else theta).clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(self.loss(leaf, rows), leaf)
        return grad

    def empirical_fisher(self) -> torch.Tensor:
        """sum_i a_i g_i g_i^T: g_i the loss of sequence i alone, a_i its share of the kept targets."""
        shares = self.kept.double() / self.kept.sum()
        grads = [self.gradient(rows=slice(i, i + 1)) for i in range(len(shares))]
        return sum(a * torch.outer(g, g) for a, g in zip(shares, grads))

    def true_fisher(self) -> torch.Tensor:
        """J^T Lambda J, Lambda = (diag p - p p^T) / D at each kept position (D the kept targets)."""
        logits = self.logits(self.theta).detach()[:, :-1]
        jac = torch.autograd.functional.jacobian(lambda t: self.logits(t)[:, :-1], self.theta)
        jac = jac.reshape(-1, VOCAB, self.n)
        p = logits.softmax(-1).reshape(-1, VOCAB)
        kept = (self.labels[:, 1:] != -100).reshape(-1)
        metric = (torch.diag_embed(p) - p[:, :, None] * p[:, None, :]) * kept[:, None, None] / kept.sum()
        return torch.einsum("tcn,tcd,tdm->nm", jac, metric, jac)


def snapshot(model: torch.nn.Module) -> dict:
    return {name: t.detach().clone() for name, t in [*model.named_parameters(), *model.named_buffers()]}


def assert_untouched(model: torch.nn.Module, before: dict) -> None:
    after = snapshot(model)
    assert list(after) == list(before)
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), f"{name} changed"


def relative(actual, expected) -> float:
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    return float((actual - expected).abs().max() / expected.abs().max())


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def case(request):
    model = prepared(gpt2() if request.param == "gpt2" else llama())
    batches = padded_batches()
    reference = Reference(model, batches)
    return request.param, model, batches, reference, reference.hessian()


def test_the_models_are_the_stated_sizes_and_llama_groups_its_queries():
    assert sum(p.numel() for p in prepared(gpt2()).parameters()) == 204
    model = prepared(llama())
    assert sum(p.numel() for p in model.parameters()) == 164
    attention = model.model.layers[0].self_attn
    assert attention.k_proj.out_features * 2 == attention.q_proj.out_features  # grouped-query attention


def test_gpt2_ties_its_output_embedding_to_its_input_embedding():
    model = prepared(gpt2())
    assert model.lm_head.weight is model.transformer.wte.weight
    assert "lm_head.weight" not in dict(model.named_parameters())


def test_the_risk_is_transformers_loss_of_the_concatenated_batch(case):
    name, model, batches, reference, _ = case
    before = snapshot(model)
    value = float(EmpiricalRisk(model, CausalLMLoss(), batches).value())
    assert abs(value - float(reference.loss(reference.theta))) <= 1e-12 * abs(value)
    # transformers' own model(**batch).loss computes the cross-entropy of float32 logits
    with torch.no_grad():
        own = model(**reference.batch).loss
    assert own.dtype == torch.float32
    assert 0 < abs(value - float(own)) <= 1e-6 * abs(value)
    assert_untouched(model, before)


def test_the_two_batches_are_padded_differently_and_hold_ignored_targets():
    first, second = padded_batches()
    assert not torch.equal(first["attention_mask"], second["attention_mask"])
    assert int((first["labels"] == -100).sum()) == 3 and int((second["labels"] == -100).sum()) == 7


def test_hessian_products_match_the_reference_hessian(case):
    name, model, batches, reference, dense = case
    before = snapshot(model)
    operator = hessian_operator(model, CausalLMLoss(), batches)
    assert operator.shape == (reference.n, reference.n)
    directions = torch.randn(reference.n, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    # autograd's row i of the Hessian is d g_i / d theta; a product H v is d (g . v) / d theta
    assert relative(operator @ directions, dense.T @ directions) <= RTOL[name]
    asymmetry = float((dense - dense.T).abs().max() / dense.abs().max())
    if name == "gpt2":
        assert asymmetry <= 1e-14
    else:  # float32 inside LlamaRMSNorm
        assert 1e-8 < asymmetry <= 1e-6
    assert_untouched(model, before)


def test_lambda_max_and_top_eigenpairs_match_numpy_eigh(case):
    name, model, batches, reference, dense = case
    before = snapshot(model)
    symmetric = ((dense + dense.T) / 2).numpy()
    eigenvalues = np.linalg.eigvalsh(symmetric)
    top = eigenvalues[-1]
    rtol = RTOL[name]
    tol = TOL if name == "gpt2" else 1e-8  # Lanczos' residual check on the non-symmetric LLaMA Hessian
    assert abs(lambda_max(model, CausalLMLoss(), batches, tol=tol) - top) <= rtol * abs(top)
    pairs = top_eigenpairs(hessian_operator(model, CausalLMLoss(), batches), k=2, tol=tol, stop="residual")
    np.testing.assert_allclose(np.asarray(pairs.values), eigenvalues[::-1][:2], rtol=rtol)
    vectors = torch.as_tensor(np.asarray(pairs.vectors))
    residual = torch.from_numpy(symmetric) @ vectors - vectors * torch.as_tensor(np.asarray(pairs.values))
    assert float(residual.abs().max()) <= rtol * abs(top) * 10
    assert_untouched(model, before)


def test_hutchpp_on_the_model_is_hutchpp_on_the_reference_and_within_its_error(case):
    name, model, batches, reference, dense = case
    before = snapshot(model)
    operator = hessian_operator(model, CausalLMLoss(), batches)
    estimate = hutchpp_trace(operator, n_probes=30, seed=3, progress=False)
    on_reference = hutchpp_trace(dense.T.contiguous(), n_probes=30, seed=3, progress=False)
    scale = float(dense.abs().max()) * reference.n  # a bound on |tr H|
    assert abs(estimate.estimate - on_reference.estimate) <= RTOL[name] * scale
    assert abs(estimate.std_error - on_reference.std_error) <= RTOL[name] * scale
    assert estimate.n_hvp == 30 and estimate.std_error > 0  # 30 products, not enough for the exact trace
    assert abs(estimate.estimate - float(dense.trace())) <= 4 * estimate.std_error
    assert_untouched(model, before)


@pytest.mark.parametrize("kind", ["empirical", "true"])
def test_the_fisher_operators_and_the_fisher_rao_norm_match_the_reference(case, kind):
    name, model, batches, reference, _ = case
    before = snapshot(model)
    expected = reference.empirical_fisher() if kind == "empirical" else reference.true_fisher()
    operator = fisher_operator(model, CausalLMLoss(), batches, kind=kind)
    directions = torch.randn(reference.n, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert relative(operator @ directions, expected @ directions) <= RTOL[name]
    theta = reference.theta
    fisher_rao = float(theta @ (operator @ theta)) ** 0.5  # <theta, F theta>^(1/2), Liang et al. (2019)
    assert abs(fisher_rao - float(theta @ expected @ theta) ** 0.5) <= RTOL[name] * fisher_rao
    assert_untouched(model, before)


def test_the_true_fisher_of_the_causal_lm_loss_is_its_gauss_newton_matrix(case):
    name, model, batches, reference, _ = case
    from lossgeom.curvature import ggn_operator

    directions = torch.randn(reference.n, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ggn = ggn_operator(model, CausalLMLoss(), batches) @ directions
    fisher = fisher_operator(model, CausalLMLoss(), batches, kind="true") @ directions
    assert relative(fisher, ggn) <= TOL


def test_adaptive_sharpness_matches_asam_by_hand(case):
    name, model, batches, reference, _ = case
    before = snapshot(model)
    rho, eta = 0.05, 0.01
    value = flatness.adaptive_sharpness(model, CausalLMLoss(), batches, rho=rho, eta=eta)
    theta, grad = reference.theta, reference.gradient()
    scale = torch.cat(
        [
            (p.detach().abs() + eta).reshape(-1) if "weight" in n else torch.ones(p.numel(), dtype=torch.float64)
            for n, p in model.named_parameters()
        ]
    )
    step = rho * scale**2 * grad / (scale * grad).norm()
    with torch.no_grad():
        expected = float(reference.loss(theta + step) - reference.loss(theta))
    assert abs(value - expected) <= RTOL[name] * abs(expected)
    assert_untouched(model, before)


def test_a_streamed_dataloader_of_dict_batches_gives_the_same_lambda_max():
    model = prepared(gpt2())
    batches = padded_batches()
    rows = concatenated(batches)
    sequences = [{key: value[i] for key, value in rows.items()} for i in range(len(rows["labels"]))]
    # batches of 4 and 2 (the list holds 3 and 3): the risk weights them as one batch of six
    loader = torch.utils.data.DataLoader(sequences, batch_size=4, shuffle=False)
    before = snapshot(model)
    held = lambda_max(model, CausalLMLoss(), batches, tol=1e-12)
    streamed = lambda_max(model, CausalLMLoss(), loader, tol=1e-12)
    assert abs(streamed - held) <= TOL * abs(held)
    assert EmpiricalRisk(model, CausalLMLoss(), loader).source.streamed
    assert_untouched(model, before)


def test_a_gpt2_of_118k_parameters_runs_matrix_free():
    """GPT-2 with 118,528 parameters (width 64, two layers, vocabulary 256, 32 positions) on four
    padded sequences of 8 tokens in two batches: a dense Hessian would take 112 GB. One
    ``lambda_max`` to a loose tolerance (about 20 products, a second or two), and the same
    Lanczos run's eigenpair checked with a Hessian-vector product by autograd on transformers'
    loss of the concatenated batch."""
    model = prepared(gpt2(vocab=256, width=64, layers=2, positions=32, inner=None), seed=6)
    with torch.no_grad():  # order-one logits at this width
        for parameter in model.parameters():
            parameter.mul_(0.2)
    assert sum(p.numel() for p in model.parameters()) == 118_528
    batches = padded_batches(lengths=([8, 6], [8, 5]), vocab=256, length=8, seed=7)
    before = snapshot(model)
    sharpness = lambda_max(model, CausalLMLoss(), batches, tol=1e-4)
    pair = top_eigenpairs(hessian_operator(model, CausalLMLoss(), batches), k=1, tol=1e-4, method="lanczos")
    assert abs(float(pair.values[0]) - sharpness) <= 1e-3 * abs(sharpness)
    reference = Reference(model, batches)
    v = torch.as_tensor(np.asarray(pair.vectors)[:, 0])
    leaf = reference.theta.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(reference.loss(leaf), leaf, create_graph=True)
    (hv,) = torch.autograd.grad(grad @ v, leaf)
    assert abs(float(v @ hv) - sharpness) <= 1e-3 * abs(sharpness)  # the Rayleigh quotient
    assert float((hv - sharpness * v).norm()) <= 1e-2 * abs(sharpness)
    assert_untouched(model, before)


def readme_example() -> str:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "CausalLMLoss" in b]
    return block


def test_the_readmes_huggingface_example_runs_and_its_numbers_agree():
    namespace: dict = {}
    exec(compile(readme_example(), "README.md", "exec"), namespace)
    model, batches, sharpness = namespace["model"], namespace["batches"], namespace["sharpness"]
    assert isinstance(model, transformers.GPT2LMHeadModel) and all(-100 in b["labels"] for b in batches)
    assert abs(sharpness - float(namespace["top"].values[0])) <= 1e-6 * abs(sharpness)
    reference = Reference(model, batches)
    value = float(EmpiricalRisk(model, namespace["loss"], batches).value())
    assert abs(value - float(reference.loss(reference.theta))) <= 1e-12 * value
    trace = namespace["trace"]
    assert trace.n_hvp == 30 and np.isfinite(trace.estimate) and trace.std_error > 0
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    empirical = fisher_operator(model, namespace["loss"], batches, kind="empirical")
    assert abs(namespace["rao"] - float(theta @ (empirical @ theta)) ** 0.5) <= 1e-10 * namespace["rao"]
