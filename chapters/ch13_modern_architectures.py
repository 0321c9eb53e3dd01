# ---
# jupyter:
#   jupytext:
#     default_lexer: ipython3
#     formats: ipynb,md:myst,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# (ch-modern-architectures)=
# # The symmetries of the architectures people train
#
# The earlier chapters met symmetries in small multilayer perceptrons: ReLU rescalings,
# permutations, the softmax shift. The networks people train carry larger ones. Batch
# normalisation {cite}`ioffe2015batch` undoes any positive scale of the weights feeding a
# channel, residual blocks {cite}`he2016deep` add their own rescalings, LayerNorm
# {cite}`ba2016layer` passes a scale to the map that reads it, and every attention head
# {cite}`vaswani2017attention` has a whole general linear group of invisible changes of
# basis. This chapter derives each one exactly, checks it on a trained BatchNorm ResNet
# (digits) and a trained transformer (modular addition), and asks which flatness measures
# each one moves: the question {cite:t}`dinh2017sharp` raised for ReLU networks, here for
# the layers that carry the largest gauges. It ends with the question that matters for
# practice {cite}`jiang2020fantastic,andriushchenko2023modern`: over a family of trained
# models, does a measure's rank correlation with the generalisation gap survive those moves?
#
# ```{admonition} Key ideas
# :class: tip
# - BatchNorm makes the loss blind to the scale of the weights feeding a channel, so the
#   largest Hessian eigenvalue of one and the same function can be moved over orders of
#   magnitude ({numref}`fig-ch13-bn-sweep`).
# - Residual blocks and LayerNorm hand a scale from one layer to the layer that reads it; a
#   registry finds most of these moves in the network's graph, and their number follows
#   from the architecture.
# - Every attention head carries a general linear group of invisible changes of basis, the
#   *attention gauge*; at a trained transformer its directions are nearly flat, but only as
#   flat as the gradient lets them be ({numref}`fig-ch13-spectrum`).
# - Euclidean sharpness moves under all of these, elementwise-adaptive sharpness (ASAM) only
#   under some, the Fisher-Rao norm under none ({numref}`fig-ch13-moves`); so a measure's rank
#   correlation with the generalisation gap can depend on coordinates the function does not
#   see ({numref}`fig-ch13-family`).
# ```
#
# **Claims established here:** X1, X2, X3, X4, X5, X6.
#
# Each status in the ledger at the end is read from the outputs by one rule, with the
# criterion for each claim stated before its row: **holds** for an identity (derived exactly;
# the numeric check confirms only that the code implements it); **holds at our scale** when
# every measured part of the claim meets its criterion on the networks here; **differs** when
# a measured part goes the other way; **not reproduced** when the measurements do not support
# a reported effect (for a correlation: no Kendall $\tau$ significant at the 5% level after a
# Bonferroni correction over the measures).
#
# We load the tools once. Torch runs in float64 on one thread:

# %% tags=["remove-cell"]
# Only on Google Colab: install the book's package and what the chapter imports.
import subprocess, sys
if "google.colab" in sys.modules:
    book = "lossgeom[book] @ git+https://github.com/lossgeom/same-function-different-geometry@main"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", book], check=True)

# %% tags=["hide-cell"]
from lossgeom_book.setup import setup

ledger = setup("the symmetries of the architectures people train", single_thread=True)

# %% tags=["hide-input"]
import numpy as np
import sympy as sp
import torch
import matplotlib.pyplot as plt
from IPython.display import Math, display
from torch import nn

from lossgeom import curvature, flatness, symmetries
from lossgeom.contract import MeasurementContract
from lossgeom.formatting import fmt, rounding_level
from lossgeom_book import architectures as arch, data, tasks
from lossgeom_book import layer_symmetries as ls
from lossgeom_book.display import glue_figure, glue_value

# %% [markdown]
# The sizes are set in one place. `SCALE = "book"` runs in well under a minute; `"large"`
# doubles the widths, the data and the family (not run here):

# %%
SCALE = "book"
SIZES = {"book": dict(width=3, n_train=256, n_measure=64, steps=100, family=16, d_model=8,
                      c_sweep=(0.1, 0.3, 1.0, 10.0)),
         "large": dict(width=6, n_train=512, n_measure=256, steps=200, family=32,
                       d_model=16, c_sweep=(0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0))}[SCALE]
CE = nn.CrossEntropyLoss()

# %% [markdown]
# ## Batch normalisation: a scale the loss cannot see
#
# A BatchNorm channel maps a pre-activation $z$ to
# $\mathrm{BN}(z, \mu, v) = \gamma (z - \mu)/\sqrt{v + \epsilon} + \beta$.
# In eval mode $\mu$ and $v$ are stored running statistics. Scaling the weights that produce
# $z$ by $c > 0$ scales $z$ by $c$; if the statistics move along, $\mu \to c\mu$ and
# $v \to c^2(v + \epsilon) - \epsilon$, the channel's output does not change at all, $\epsilon$
# included. We write the channel as a sympy function:

# %%
z, mu, v, eps, c, gam, bet = sp.symbols("z mu v epsilon c gamma beta", positive=True)
bn = lambda z_, mu_, v_: gam * (z_ - mu_) / sp.sqrt(v_ + eps) + bet
moved = bn(c * z, c * mu, c**2 * (v + eps) - eps)

# %% [markdown]
# and check that the moved channel simplifies back to the original one:

# %%
BN = sp.Function("BN")
display(Math(sp.latex(sp.Eq(BN(c * z, c * mu, c**2 * (v + eps) - eps), sp.simplify(moved)))))
assert sp.simplify(moved - bn(z, mu, v)) == 0

# %% [markdown]
# In train mode the statistics are those of the batch, and they move with the weights by
# themselves. For a channel reading three inputs through one weight $w$, the normalised
# values are exactly scale invariant when $\epsilon = 0$; with $\epsilon > 0$ the derivative
# along the scale is not zero but $\epsilon$-small. The first normalised value, as a function
# of the weight:

# %%
w = sp.symbols("w", positive=True)
xs = sp.symbols("x1:4", real=True)
def normalised(weight, eps_):
    zs = [weight * x for x in xs]
    m = sum(zs) / 3
    var = sum((zi - m) ** 2 for zi in zs) / 3
    return (zs[0] - m) / sp.sqrt(var + eps_)


# %% [markdown]
# Scaled by $c$, it is unchanged at $\epsilon = 0$, and its derivative in $c$ at $c = 1$
# vanishes with $\epsilon$:

# %%
assert sp.simplify(normalised(c * w, 0) - normalised(w, 0)) == 0
euler = sp.simplify(sp.diff(normalised(c * w, eps), c).subs(c, 1))
assert sp.simplify(euler.subs(eps, 0)) == 0

# %% [markdown]
# A loss that is invariant under $W \to cW$ obeys two identities, which we derive for a
# generic scale-invariant function of two weights, $L(w_1, w_2) = f(w_1/\lVert w\rVert)$.
# Differentiating $L(cW) = L(W)$ in $c$ at $c = 1$ gives $\langle \nabla L, W\rangle = 0$;
# differentiating in $W$ gives $\nabla L(cW) = \nabla L(W)/c$ and so
# $\nabla^2 L(cW) = c^{-2}\,\nabla^2 L(W)$:
#
# $$
# \langle \nabla_W L, W\rangle = 0, \qquad \nabla^2_W L(cW) = c^{-2}\,\nabla^2_W L(W).
# $$ (eq-ch13-scale)

# %%
w1, w2 = sp.symbols("w1 w2", positive=True)
f = sp.Function("f")
L = lambda a, b: f(a / sp.sqrt(a**2 + b**2))
grad = [sp.diff(L(w1, w2), s) for s in (w1, w2)]
assert sp.simplify(grad[0] * w1 + grad[1] * w2) == 0

# %% [markdown]
# The second identity, on the Hessian:

# %%
hess = sp.hessian(L(w1, w2), (w1, w2))
hess_at_cw = hess.subs({w1: c * w1, w2: c * w2}, simultaneous=True)
assert sp.simplify(hess_at_cw - hess / c**2) == sp.zeros(2, 2)

# %% [markdown]
# The Hessian at $cW$ is the Hessian at $W$ divided by $c^2$. A sharpness that is
# the largest eigenvalue of this block can therefore be made as large as we like, with the
# function untouched {cite}`dinh2017sharp,vanlaarhoven2017l2`.
#
# ### A BatchNorm ResNet on digits
#
# `arch.DigitsResNet` has a stem (conv, BN, ReLU), an identity-shortcut BasicBlock and a
# BasicBlock whose shortcut is a stride-2 1x1 convolution with BatchNorm, then average
# pooling and a linear readout. `arch.train_model` trains it through
# `lossgeom.training.train` (full-batch Adam) on the train-mode loss, with batch statistics,
# then sets the running statistics to those of the whole training set; every measurement
# after that is in eval mode:

# %%
digits = data.digits(SIZES["n_train"], 256, seed=0)
resnet_fit = arch.train_model(arch.DigitsResNet(SIZES["width"], seed=0), digits,
                              steps=SIZES["steps"], lr=0.03)
resnet = resnet_fit.model
n_resnet = sum(p.numel() for p in resnet.parameters())

# %%
assert resnet_fit.losses[-1] < resnet_fit.losses[0] / 10
print(f"{n_resnet} parameters; train loss {fmt(resnet_fit.losses[0], 3)} -> "
      f"{fmt(resnet_fit.train_loss, 2)} (eval mode); train / test accuracy "
      f"{fmt(resnet_fit.train_accuracy, 3)} / {fmt(resnet_fit.test_accuracy, 3)}")


# %% [markdown]
# The network fits its training set and reaches the test accuracy printed. We measure
# curvature on the first {glue:text}`ch13-n-measure` training examples.
#
# ### Moving $\lambda_{\max}$ without moving the function
#
# We scale the weights that feed every one of the six BatchNorm layers by the same $c$,
# with the running statistics transformed along (the library's
# `symmetries.batchnorm_scale_invariance`, composed over the layers), and measure the largest
# Hessian eigenvalue (Lanczos, `curvature.lambda_max`) at each $c$. The move at one $c$:

# %%
def scaled(model, c):
    moves = [symmetries.batchnorm_scale_invariance(
                 a, b, torch.full((k * model.width,), c), eps=model.get_submodule(b).eps)
             for a, b, k in ls.RESNET_BN]
    return symmetries.compose(moves, f"BN scale c = {c}")


# %% [markdown]
# The audit (`symmetries.audit`) checks a moved model's logits against the trained one's;
# we keep the worst relative change over a list of moves:

# %%
def worst_gap(model, probe, moves):
    table = symmetries.audit(model, None, probe, loss=CE, symmetries=list(moves))
    return max(r.relative_discrepancy for r in table)


# %% [markdown]
# Over the sweep of $c$:

# %%
C_SWEEP = SIZES["c_sweep"]
sweep_gap = worst_gap(resnet, digits.x_test, [scaled(resnet, c) for c in C_SWEEP])
assert sweep_gap <= 1e-10

# %% [markdown]
# The same function at every $c$, and its $\lambda_{\max}$ on the measurement batch:

# %%
measure_data = (digits.x_train[:SIZES["n_measure"]], digits.y_train[:SIZES["n_measure"]])
sweep_models = {c: scaled(resnet, c).applied(resnet) for c in C_SWEEP}
sweep_lmax = {c: curvature.lambda_max(m, CE, measure_data, tol=1e-6)
              for c, m in sweep_models.items()}

# %%
print(f"outputs on the test inputs differ by {rounding_level(sweep_gap, 1e-13)} of their scale")
for c_value, lam in sweep_lmax.items():
    print(f"c = {fmt(c_value, 2):>4}: lambda_max = {fmt(lam, 4)}")

# %% [markdown]
# The outputs agree to rounding at every $c$, while $\lambda_{\max}$ goes from
# {glue:text}`ch13-lmax-small-c` at $c = 0.1$ to {glue:text}`ch13-lmax-large-c` at $c = 10$
# ({glue:text}`ch13-lmax-1` at the trained point). It grows as $c^{-2}$ for small $c$, the
# block law {eq}`eq-ch13-scale`. For large $c$ it levels off at the curvature of the
# parameters that are not rescaled (the BatchNorm affines and the readout), so one uniform
# $c$ moves it down only that far; {numref}`fig-ch13-bn-sweep` shows the sweep:

# %% tags=["hide-input"]
sweep_contract = MeasurementContract(
    centre=f"the trained DigitsResNet (width {SIZES['width']}, {n_resnet} parameters), eval mode",
    directions="all parameter directions (Lanczos on Hessian-vector products)",
    normalisation="none (Euclidean lambda_max)", radius="n/a (curvature)",
    loss="cross-entropy", reduction=f"mean over {SIZES['n_measure']} training examples",
    data=digits.description, model_mode="eval (running statistics moved with c)",
    resolution=f"c in {C_SWEEP}, Lanczos tol 1e-6", precision="float64")
fig, ax = plt.subplots(figsize=(5, 3.2))
ax.loglog(C_SWEEP, list(sweep_lmax.values()), "o-", label="lambda_max at c")
ax.loglog(C_SWEEP[:2], [sweep_lmax[1.0] * c**-2 for c in C_SWEEP[:2]], "--", label="c^-2 law")
ax.set_xlabel("scale c of the weights feeding every BatchNorm")
ax.set_ylabel("lambda_max of the loss Hessian")
ax.legend()
glue_figure("ch13-bn-sweep", fig, sweep_contract,
            "The largest Hessian eigenvalue of one function, at "
            f"{len(C_SWEEP)} function-preserving scalings")

# %% [markdown]
# ```{glue:figure} fig-ch13-bn-sweep
# :name: fig-ch13-bn-sweep
#
# {glue:text}`cap-ch13-bn-sweep`
#
# {glue:md}`con-ch13-bn-sweep`
# ```
#
# The block law itself can be read exactly. Along any direction $u$ inside the rescaled
# block, the curvature at $c$ is $c^{-2}$ times the curvature at the trained point
# (`ls.curvature_along`). A random direction $u$ in the first block's first convolution:

# %%
gen = torch.Generator().manual_seed(0)
weight = resnet.state_dict()["block1.conv1.weight"]
u = {"block1.conv1.weight": torch.randn(weight.shape, generator=gen)}

# %% [markdown]
# The curvature along $u$ at three values of $c$, and how far $c^2$ times it strays from
# its value at $c = 1$:

# %%
block_c = {c: ls.curvature_along(sweep_models[c], measure_data, u) for c in (0.1, 1.0, 10.0)}
block_law = max(abs(block_c[c] * c**2 / block_c[1.0] - 1) for c in (0.1, 10.0))
assert block_law <= 1e-9

# %%
print(f"u^T H u / |u|^2 at c = 0.1, 1, 10: " + ", ".join(fmt(v, 4) for v in block_c.values()))
print(f"c^2 times it over its value at c = 1 differs from 1 by {rounding_level(block_law, 1e-12)}")

# %% [markdown]
# In train mode, with batch statistics, the identity $\langle \nabla_W L, W\rangle = 0$ holds
# for $\epsilon = 0$ and is $\epsilon$-small otherwise (`ls.train_mode_alignment`, the cosine of
# the gradient and the weight of each convolution that feeds a BatchNorm). Torch refuses
# $\epsilon = 0$ in train mode, so the exact case runs at $\epsilon = 10^{-20}$, far below
# the rounding of the batch variances. In eval mode the running statistics are buffers, held
# fixed while the gradient is taken, and the loss is invariant only when they move along with
# $c$; `ls.eval_mode_alignment` measures the same cosine there. In train mode, at both values
# of $\epsilon$:

# %%
aligned = {e: ls.train_mode_alignment(resnet, measure_data, eps=e) for e in (1e-20, 1e-5)}
exact_cos = max(abs(v) for v in aligned[1e-20].values())
eps_cos = max(abs(v) for v in aligned[1e-5].values())

# %% [markdown]
# and in eval mode, with the running statistics fixed:

# %%
eval_cos = max(abs(v) for v in ls.eval_mode_alignment(resnet, measure_data).values())
assert exact_cos <= 1e-10 and eps_cos <= 1e-2 and eval_cos >= 100 * eps_cos

# %%
print("largest |cos(grad_W, W)| over six convolutions: "
      f"eps = 1e-20 {rounding_level(exact_cos, 1e-12)};"
      f" eps = 1e-5 (PyTorch's default) {fmt(eps_cos, 1)}")
print(f"eval mode, running statistics fixed: {fmt(eval_cos, 2)}")

# %% tags=["remove-cell"]
glue_value("ch13-n-measure", SIZES["n_measure"])
glue_value("ch13-lmax-small-c", sweep_lmax[0.1], 4)
glue_value("ch13-lmax-large-c", sweep_lmax[10.0], 4)
glue_value("ch13-lmax-1", sweep_lmax[1.0], 4)
glue_value("ch13-eps-cos", fmt(eps_cos, 1))
glue_value("ch13-eval-cos", fmt(eval_cos, 2))

# %% [markdown]
# With PyTorch's default $\epsilon$ the gradient's cosine with the weight is
# {glue:text}`ch13-eps-cos` at most: the train-mode invariance is approximate by exactly the
# $\epsilon$ term sympy found. In eval mode with the statistics fixed the cosine reaches
# {glue:text}`ch13-eval-cos`, far from zero: $L(cW) \ne L(W)$ there unless the statistics
# move too, so $\langle \nabla_W L, W\rangle = 0$ is a train-mode identity. What holds in
# eval mode is the invariance of the function with the statistics moved along, which is
# exact, and with it the $c^{-2}$ law measured above (it compares Hessians in $W$ at points
# whose statistics moved with $c$). X1's criterion: the outputs stay within $10^{-10}$ over
# the sweep while $\lambda_{\max}$ spans more than a factor 100, the block law and the
# train-mode identity hold to rounding, and the eval-mode cosine is above 0.01.

# %%
x1_status = ("holds at our scale" if sweep_gap <= 1e-10 and block_law <= 1e-9 and exact_cos <= 1e-10
             and max(sweep_lmax.values()) >= 100 * min(sweep_lmax.values()) and eval_cos >= 1e-2
             else "differs")

# %% tags=["remove-cell"]
ledger.add(
    "X1",
    r"BatchNorm, $W \to cW$ on the weights feeding a channel: in train mode ($\epsilon = 0$) "
    r"$L(cW) = L(W)$ and $\langle \nabla_W L, W\rangle = 0$; in eval mode the function is kept "
    r"with $\mu \to c\mu$, $v \to c^2 (v + \epsilon) - \epsilon$ and the Hessian's $W$ block "
    r"scales as $c^{-2}$, while with the statistics fixed $\langle \nabla_W L, W\rangle \ne 0$ "
    r"(derived); $\lambda_{\max}$ of a trained BN ResNet moved by such $c$",
    f"$\\lambda_{{\\max}}$ = {fmt(sweep_lmax[C_SWEEP[0]], 4)} at $c = {C_SWEEP[0]:g}$, "
    f"{fmt(sweep_lmax[C_SWEEP[-1]], 4)} at $c = {C_SWEEP[-1]:g}$; output change "
    f"{rounding_level(sweep_gap, 1e-13)}",
    details={"lambda_max at c = " + ", ".join(f"{c:g}" for c in C_SWEEP): list(sweep_lmax.values()),
     "output change over the sweep": rounding_level(sweep_gap, 1e-13),
     "Hessian block law c^2 u^T H_c u / u^T H u - 1": rounding_level(block_law, 1e-12),
     "train-mode |cos(grad_W, W)|, eps = 1e-20": rounding_level(exact_cos, 1e-12),
     "train-mode |cos(grad_W, W)|, eps = 1e-5": fmt(eps_cos, 1),
     "eval-mode |cos(grad_W, W)|, running statistics fixed": fmt(eval_cos, 2)},
    reported=r"$\lambda_{\max}$ can be made arbitrarily large by a function-preserving change "
             r"(Dinh et al. 2017); the weights' effective learning rate scales as $\Vert W\Vert^{-2}$ "
             "(van Laarhoven 2017)",
    sig=4, status=x1_status,
    note=f"one ResNet of {n_resnet} parameters on digits; a uniform $c$ lowers $\\lambda_{{\\max}}$ "
         r"only down to the curvature of the parameters it does not rescale; "
         r"$\langle \nabla_W L, W\rangle = 0$ is the train-mode part, the $c^{-2}$ law the eval-mode one",
)

# %% [markdown]
# ## Residual blocks: whose units can be rescaled
#
# In a block $x + g(x)$ the branch's hidden ReLU units can be rescaled and permuted as in an
# MLP, as long as the map that reads them compensates: here a BatchNorm affine
# $(\gamma, \beta) \to c(\gamma, \beta)$ passes through the ReLU into the next convolution's
# input channels divided by $c$. The residual stream itself can be rescaled too, channel by
# channel, if every branch that writes to it (the two BatchNorms whose outputs are summed)
# and every map that reads it move together. The library has the first three
# (`symmetries.batchnorm_scale_invariance`, `symmetries.relu_neuron_rescaling` with the
# BatchNorm as the first layer, `symmetries.batchnorm_channel_permutation`); the last is the
# book's `ls.residual_stream_rescaling`, for a reason the registry states below.
# `ls.resnet_symmetries` draws one of each (scales log-uniform in $[1/3, 3]$):

# %%
resnet_moves = ls.resnet_symmetries(resnet, size=3.0, seed=0)
moved_resnets = {name: move.applied(resnet) for name, move in resnet_moves.items()}
move_audit = symmetries.audit(resnet, None, digits.x_test, loss=CE,
                              symmetries=list(resnet_moves.values()))

# %% [markdown]
# and the audit finds that each leaves the outputs unchanged:

# %%
move_gaps = dict(zip(resnet_moves, (r.relative_discrepancy for r in move_audit)))
assert max(move_gaps.values()) <= 1e-10
for name, gap in move_gaps.items():
    print(f"{name:45s} outputs change by {rounding_level(gap, 1e-13)}")

# %% [markdown]
# What does the library's registry find on its own? `symmetries.find_symmetries` reads the
# network's graph and reports the symmetries it can identify safely, grouped here by kind:

# %%
found = symmetries.find_symmetries(resnet, loss=CE, seed=0)
found_counts = {kind: len(group) for kind, group in found.by_kind().items()}
for kind, count in found_counts.items():
    print(f"{kind:28s} {count}")

# %% [markdown]
# The counts follow from the architecture: each of the six BatchNorm layers reads one
# convolution (its scale invariance); each of the two blocks has one BatchNorm-ReLU-conv
# path inside its branch (the BN-affine rescaling and the permutation of its hidden
# channels); the readout carries the softmax shift:

# %%
n_blocks, n_bn = 2, len(ls.RESNET_BN)
derived_counts = {"softmax row shift": 1, "batch-norm scale invariance": n_bn,
                  "ReLU rescaling": n_blocks, "permutation": n_blocks}
assert found_counts == derived_counts

# %% [markdown]
# The audit then checks every symmetry the registry reports on the test inputs:

# %%
found_audit = symmetries.audit(resnet, None, digits.x_test, loss=CE, symmetries=found.symmetries)
found_gap = max(r.relative_discrepancy for r in found_audit)
assert all(r.is_symmetry for r in found_audit) and found_gap <= 1e-10
print(f"{len(found)} symmetries found, as derived; largest output change "
      f"{rounding_level(found_gap, 1e-13)}")

# %% [markdown]
# What it lists as not audited, with its reasons:

# %%
for reason in found.skipped:
    print("-", reason)
stream_reason = next(r for r in found.skipped if "residual block's output" in r)

# %% [markdown]
# The registry does not report the residual-stream rescaling: the block outputs' channels
# "{glue:text}`ch13-stream-reason`". A rescaling of one block's output alone is indeed not
# a symmetry; the one above moves the whole stream (every branch that writes to it and
# every layer that reads it) at once, which the registry does not look for.
#
# How many independent continuous moves are there? From the architecture (width $w$): one
# BN scale per BatchNorm channel, $w + 2w + 6w = 9w$; one BN-affine rescaling per hidden
# channel of the two blocks, $w + 2w$ (these $12w$ are the registry's continuous kinds);
# one residual-stream rescaling per stream channel, $w + 2w$; in all $15w$ (the softmax
# shift of the readout, $2w + 1$ more, is not counted here). Which BN scale do we count? In
# eval mode the running statistics are buffers, not parameters, and the library's move above
# changes them: its tangent in parameter space ($W$ alone, along its rows) is not a direction
# in which the loss with the statistics fixed is constant. The count uses the move on the
# parameters alone, exact with the statistics fixed: with $s = \sqrt{v + \epsilon}$,
# $W \to cW$, $\gamma \to \gamma/c$ and $\beta \to \beta - \gamma\mu(1 - 1/c)/s$
# (`ls.batchnorm_parameter_rescaling`). Sympy checks it:

# %%
s_bn = sp.sqrt(v + eps)
fixed_stats = (gam / c) * (c * z - mu) / s_bn + bet - gam * mu * (1 - 1 / c) / s_bn
assert sp.simplify(fixed_stats - bn(z, mu, v)) == 0

# %% [markdown]
# The rank of the tangents of these moves at the trained point, computed by forward-mode
# differentiation of the transforms (`ls.resnet_scale_tangents` with the statistics fixed),
# is the number that are independent there:

# %%
tangents = ls.resnet_scale_tangents(resnet, statistics="fixed")
derived = 15 * resnet.width
tangent_rank = int(torch.linalg.matrix_rank(tangents))
assert tangent_rank == derived
print(f"derived 15 w = {derived}; rank of the tangents {tangent_rank}")

# %% tags=["remove-cell"]
glue_value("ch13-stream-reason", stream_reason.split("a residual sum: they ", 1)[1])

# %% [markdown]
# The count matches: all $15w$ moves are independent at this point, and the registry's
# count of symmetries by kind is the one derived from the architecture. With the statistics
# fixed, are the BN-scale tangents null directions of the Hessian? We compare the Hessian's
# action on the orthonormalised BN-scale tangents of both moves, relative to $\lambda_{\max}$
# at the trained point (Hessian-vector products through `curvature.hessian_operator`):

# %%
H_resnet = curvature.hessian_operator(resnet, CE, measure_data)
def bn_scale_action(T):
    Q_bn, _ = torch.linalg.qr(T[:, :9 * resnet.width])
    return float(torch.linalg.matrix_norm(H_resnet @ Q_bn, 2)) / sweep_lmax[1.0]


# %%
bn_action = {"fixed": bn_scale_action(tangents),
             "moved": bn_scale_action(ls.resnet_scale_tangents(resnet, statistics="moved"))}
assert bn_action["fixed"] <= 1e-2 and bn_action["moved"] >= 100 * bn_action["fixed"]

# %%
print(f"|H Q| / lambda_max on the BN-scale tangents: statistics fixed {fmt(bn_action['fixed'], 2)}, "
      f"W alone (the library's move) {fmt(bn_action['moved'], 2)}")

# %% tags=["remove-cell"]
glue_value("ch13-bn-action-fixed", bn_action["fixed"], 2)
glue_value("ch13-bn-action-moved", bn_action["moved"], 2)

# %% [markdown]
# The parameters-only tangents feel {glue:text}`ch13-bn-action-fixed` of $\lambda_{\max}$,
# small but not zero, as for any symmetry at a point that is not exactly critical;
# $W$ alone along its rows, the parameter part of the library's move, feels
# {glue:text}`ch13-bn-action-moved` of it and is no null direction. X2's criterion: every move
# keeps the outputs to $10^{-10}$, and the registry's counts and the tangents' rank equal the
# derived ones.

# %%
x2_status = ("holds at our scale" if max(move_gaps.values()) <= 1e-10 and found_gap <= 1e-10
             and found_counts == derived_counts and tangent_rank == derived else "differs")

# %% tags=["remove-cell"]
ledger.add(
    "X2",
    "In residual blocks the BN affine rescaling through the branch's ReLU, the residual-stream "
    "rescaling and hidden-unit permutations are symmetries; their number matches the count "
    "derived from the architecture (eval mode, counted with the parameters-only BN scale, "
    "running statistics fixed)",
    f"tangent rank {tangent_rank}, derived $15w$ = {derived}; the registry's {len(found)} "
    "symmetries, by kind, as derived",
    details={"largest output change over the four moves": rounding_level(max(move_gaps.values()), 1e-13),
     "continuous moves derived (15 w)": derived, "rank of their tangents": tangent_rank,
     "BN scale in the count": "W -> cW, gamma -> gamma / c, beta -> beta - gamma mu (1 - 1/c) / s",
     "|H Q| / lambda_max on BN-scale tangents, statistics fixed / W alone":
         [bn_action["fixed"], bn_action["moved"]],
     "found by lossgeom.symmetries.find_symmetries, by kind": found_counts,
     "derived from the architecture, by kind": derived_counts,
     "largest output change over the registry's symmetries": rounding_level(found_gap, 1e-13)},
    sig=2, status=x2_status,
    note="the registry finds every kind derived; the residual-stream rescaling is the book's "
         "transform, listed by the registry as not audited; $W$ alone (the library's BN move "
         "without its statistics) is not a null direction",
)

# %% [markdown]
# ## Attention: a general linear group per head
#
# A head scores a query $q$ against a key $k$ by $q k^\top$ with $q = x W_Q$, $k = x W_K$,
# and writes $a\,v\,W_O$ with $v = x W_V$. For invertible $A$ and $B$ of the head's width,
# $(W_Q, W_K) \to (W_Q A, W_K A^{-\top})$ and $(W_V, W_O) \to (W_V B, B^{-1} W_O)$ change
# nothing {cite}`dasilva2025hide`. Sympy checks it for a width-2 head with generic
# matrices:

# %%
dk = 2
q, k, vv = (sp.Matrix(1, dk, sp.symbols(f"{s}1:{dk + 1}")) for s in ("q", "k", "v"))
A = sp.Matrix(dk, dk, sp.symbols("a1:5"))
B = sp.Matrix(dk, dk, sp.symbols("b1:5"))
W_O = sp.Matrix(dk, 3, sp.symbols("o1:7"))

# %% [markdown]
# The score and the head's output before and after:

# %%
score = (q * A) * (k * A.inv().T).T
assert sp.simplify(score - q * k.T) == sp.zeros(1, 1)
assert sp.simplify((vv * B) * (B.inv() * W_O) - vv * W_O) == sp.zeros(1, 3)
display(Math(r"qA\,(kA^{-\top})^\top = " + sp.latex(sp.simplify(score[0]))))

# %% [markdown]
# Each head contributes $d_k^2 + d_v^2$ continuous directions, so a layer of $h$ heads has a
# gauge of dimension $h(d_k^2 + d_v^2)$, plus the $h!$ head permutations:

# %%
h_, dk_, dv_ = sp.symbols("h d_k d_v", positive=True, integer=True)
gauge_dim = h_ * (dk_**2 + dv_**2)

# %% [markdown]
# For the transformer below, with two heads of width $d_{\text{model}}/2$:

# %%
d_model, n_heads = SIZES["d_model"], 2
head_width = d_model // n_heads
predicted_gauge = int(gauge_dim.subs({h_: n_heads, dk_: head_width, dv_: head_width}))
display(Math(r"\dim = " + sp.latex(gauge_dim) + f" = {predicted_gauge}"))

# %% [markdown]
# ### A trained transformer on modular addition
#
# `arch.ModularEncoder` embeds the pair $(a, b)$ with token and position embeddings, runs one
# pre-LN `nn.TransformerEncoderLayer` (two heads, dropout 0, then a final LayerNorm) and reads
# the last position. We train it on $(a + b) \bmod 11$ with full-batch Adam:

# %%
modular = tasks.modular_arithmetic(11, "add", train_fraction=0.8, seed=0)
encoder_fit = arch.train_model(arch.ModularEncoder(11, d_model=d_model, n_heads=n_heads, seed=0),
                               modular, steps=400, lr=0.01)
encoder, ATTN = encoder_fit.model, "encoder.layers.0.self_attn"
n_encoder = sum(p.numel() for p in encoder.parameters())

# %%
assert encoder_fit.losses[-1] < encoder_fit.losses[0] / 100
print(f"{n_encoder} parameters; train loss {fmt(encoder_fit.losses[0], 3)} -> "
      f"{fmt(encoder_fit.train_loss, 1)}; train / test accuracy "
      f"{fmt(encoder_fit.train_accuracy, 3)} / {fmt(encoder_fit.test_accuracy, 2)}")


# %% [markdown]
# It fits the training pairs and does not generalise at this size (it memorises; the
# gauges do not care). One gauge per head (`symmetries.attention_head_gauge`), composed
# over the heads:

# %%
def head_gauges(As, Bs, name):
    heads = [symmetries.attention_head_gauge(ATTN, i, n_heads, As[i], Bs[i]) for i in range(n_heads)]
    return symmetries.compose(heads, name)


# %% [markdown]
# A random $A, B = I + 0.5\,G$ with $G$ standard normal:

# %%
gen = torch.Generator().manual_seed(1)
dh = d_model // n_heads
draw = lambda: [torch.eye(dh) + 0.5 * torch.randn(dh, dh, generator=gen) for _ in range(n_heads)]

# %% [markdown]
# This gauge on both heads and the head swap (`symmetries.head_permutation`) leave the
# outputs unchanged:

# %%
gauge = head_gauges(draw(), draw(), "attention gauge, A, B = I + 0.5 G")
swap = symmetries.head_permutation(ATTN, [1, 0])
enc_gaps = [worst_gap(encoder, modular.x_test, [m]) for m in (gauge, swap)]
assert max(enc_gaps) <= 1e-10
print("output change, gauge / head swap:", ", ".join(rounding_level(g, 1e-13) for g in enc_gaps))

# %% [markdown]
# The registry finds these on its own, with the layer's other symmetries:

# %%
found_enc = symmetries.find_symmetries(encoder, loss=CE, seed=0)
found_enc_counts = {kind: len(group) for kind, group in found_enc.by_kind().items()}

# %% [markdown]
# By kind, with what it lists as not audited:

# %%
for kind, count in found_enc_counts.items():
    print(f"{kind:28s} {count}")
for reason in found_enc.skipped:
    print("-", reason)

# %% [markdown]
# From the architecture: one gauge per head, one head permutation per layer, the
# pre-LN layer's two LayerNorms against the maps that read them (next section), the FFN's
# ReLU rescaling and permutation, and the readout's softmax shift; the final LayerNorm and
# the residual stream are listed as not audited:

# %%
derived_enc_counts = {"softmax row shift": 1, "attention gauge": n_heads, "head permutation": 1,
                      "layer-norm rescaling": 2, "ReLU rescaling": 1, "permutation": 1}
assert found_enc_counts == derived_enc_counts
assert symmetries.attention_gauge_dimension(encoder) == predicted_gauge

# %% [markdown]
# The audit checks all of them:

# %%
found_enc_audit = symmetries.audit(encoder, None, modular.x_test, loss=CE,
                                   symmetries=found_enc.symmetries)
found_enc_gap = max(r.relative_discrepancy for r in found_enc_audit)
assert all(r.is_symmetry for r in found_enc_audit) and found_enc_gap <= 1e-10
print(f"{len(found_enc)} symmetries found, as derived; largest output change "
      f"{rounding_level(found_enc_gap, 1e-13)}; gauge dimension "
      f"{symmetries.attention_gauge_dimension(encoder)}")

# %% [markdown]
# At a minimum every gauge tangent $t$ is a null direction of the Hessian: differentiating
# $L(\theta(A)) = L(\theta)$ twice gives $t^\top H t = -\langle \nabla L, \ddot\theta\rangle$, zero
# where the gradient is. The trained point has a small, non-zero gradient, so we measure how
# far from null the gauge directions are, relative to $\lambda_{\max}$, on the dense Hessian
# (`curvature.dense_hessian`, {glue:text}`ch13-n-encoder` parameters):

# %%
train_data = (modular.x_train, modular.y_train)
H = curvature.dense_hessian(encoder, CE, train_data)
eigenvalues, eigenvectors = torch.linalg.eigh(H)
lam_max = float(eigenvalues[-1])
grad_norm = float(curvature.references.dense_gradient(encoder, CE, train_data).norm())

# %% [markdown]
# The gauge's tangents at the trained point (`ls.attention_gauge_tangents`), their rank, and
# the Hessian's action on them, orthonormalised:

# %%
T = ls.attention_gauge_tangents(encoder, ATTN, n_heads)
Q, _ = torch.linalg.qr(T)
gauge_rank = int(torch.linalg.matrix_rank(T))
gauge_action = float(torch.linalg.matrix_norm(H @ Q, 2)) / lam_max
assert gauge_rank == predicted_gauge and gauge_action <= 1e-2

# %% [markdown]
# We count the eigenvalues with $|\lambda| \le t\,\lambda_{\max}$ with the library's
# `curvature.count_near_zero` (which scales by the largest $|\lambda|$, here $\lambda_{\max}$)
# and measure how much of the gauge lies in their eigenspace: the mean squared cosine of
# the principal angles, and the number of gauge directions within a cosine of 0.99:

# %%
THRESHOLDS = (1e-2, 1e-3, 1e-4, 1e-6)
assert float(eigenvalues.abs().max()) == lam_max
near_zero = dict(zip(THRESHOLDS, curvature.count_near_zero(eigenvalues.numpy(), THRESHOLDS).tolist()))


# %% [markdown]
# How much of the gauge lies in the eigenspace of the eigenvalues below $t\,\lambda_{\max}$:

# %%
def gauge_in_eigenspace(t):
    inside = torch.linalg.svdvals(eigenvectors[:, eigenvalues.abs() <= t * lam_max].T @ Q)
    return int((inside >= 0.99).sum()), float((inside**2).mean())
gauge_in = {t: gauge_in_eigenspace(t) for t in THRESHOLDS}

# %%
print(f"lambda_max {fmt(lam_max, 4)}, gradient norm {fmt(grad_norm, 2)}")
print(f"gauge tangents: rank {gauge_rank} (predicted {predicted_gauge}); "
      f"|H Q| / lambda_max = {fmt(gauge_action, 2)}")

# %% [markdown]
# and, threshold by threshold:

# %%
for t, n in near_zero.items():
    print(f"|lambda| <= {t:g} lambda_max: {n:3d} eigenvalues; gauge inside: {gauge_in[t][0]:2d} "
          f"directions at cosine >= 0.99, share {fmt(gauge_in[t][1], 2)}")

# %%
gradient_scale = grad_norm / lam_max
assert 0.1 <= gauge_action / gradient_scale <= 10
assert 1e-6 < gauge_action < 1e-3
assert near_zero[1e-3] > predicted_gauge and gauge_in[1e-3][1] >= 0.99
assert near_zero[1e-6] > predicted_gauge and gauge_in[1e-6][1] < 0.5

# %% tags=["remove-cell"]
glue_value("ch13-n-encoder", n_encoder)
glue_value("ch13-gauge-action", gauge_action, 2)
glue_value("ch13-gradient-scale", gradient_scale, 2)
glue_value("ch13-gauge-rank", gauge_rank)
glue_value("ch13-gauge-inside", gauge_in[1e-3][0])
glue_value("ch13-near-zero-3", near_zero[1e-3])
glue_value("ch13-gauge-captured", gauge_in[1e-3][1], 2)
glue_value("ch13-near-zero-6", near_zero[1e-6])
glue_value("ch13-gauge-captured-6", gauge_in[1e-6][1], 2)
glue_value("ch13-gauge-inside-6", gauge_in[1e-6][0])

# %% [markdown]
# The {glue:text}`ch13-gauge-rank` gauge tangents are independent, as predicted, and the
# Hessian's action on them is {glue:text}`ch13-gauge-action` of $\lambda_{\max}$: of the order
# of the gradient's norm over $\lambda_{\max}$ ({glue:text}`ch13-gradient-scale`), as the
# second-order identity says. Against the {glue:text}`ch13-near-zero-3`-dimensional
# eigenspace below $10^{-3}\lambda_{\max}$, a threshold above that action, a share
# {glue:text}`ch13-gauge-captured` of the gauge lies inside it ({glue:text}`ch13-gauge-inside`
# directions to a cosine of 0.99). Below $10^{-6}\lambda_{\max}$, under the gauge's own
# action, there are still {glue:text}`ch13-near-zero-6` eigenvalues, more than the gauge's
# dimension, but only a share {glue:text}`ch13-gauge-captured-6` of the gauge lies in their
# eigenspace ({glue:text}`ch13-gauge-inside-6` directions to 0.99): at a point with this
# gradient the gauge is near-null, not null, and a count of near-zero eigenvalues holds it
# only at a threshold above its Hessian action. The near-null space is also larger than the
# gauge. It also holds the key biases (a query's score against every key
# shifts by the same amount), the LayerNorm affines, the FFN's ReLU rescalings, the softmax
# shift, and directions the memorised data do not probe. X3's criterion: the tangents' rank
# equals the prediction, the gauge's Hessian action is below $10^{-2}\lambda_{\max}$, and at
# a threshold above that action the near-zero count is at least the gauge's dimension with
# the gauge inside its eigenspace (share at least 0.99). {numref}`fig-ch13-spectrum` shows the
# spectrum:

# %% tags=["hide-input"]
spectrum_contract = MeasurementContract(
    centre=f"the trained ModularEncoder ({n_encoder} parameters), eval mode",
    directions="all eigenvectors of the dense Hessian; the gauge's orthonormalised tangents",
    normalisation="|eigenvalue| / lambda_max", radius="n/a (curvature)",
    loss="cross-entropy", reduction=f"mean over {len(modular.y_train)} training pairs",
    data=modular.description, model_mode="eval (dropout 0)",
    resolution="every eigenvalue (torch eigvalsh)", precision="float64")
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.semilogy(np.sort(eigenvalues.abs().numpy())[::-1] / lam_max, ".", ms=3, label="|eigenvalue|")
ax.axvline(n_encoder - predicted_gauge, color="C1", ls="--", label="last h(d_k^2 + d_v^2)")
ax.axhline(gauge_action, color="C2", ls=":", label="|H Q| / lambda_max on the gauge")
ax.set_xlabel("index (largest first)")
ax.set_ylabel("|eigenvalue| / lambda_max")
ax.legend(fontsize=8)
glue_figure("ch13-spectrum", fig, spectrum_contract,
            "Hessian spectrum of a trained transformer and the size of its attention gauge")

# %% [markdown]
# ```{glue:figure} fig-ch13-spectrum
# :name: fig-ch13-spectrum
#
# {glue:text}`cap-ch13-spectrum`
#
# {glue:md}`con-ch13-spectrum`
# ```

# %%
x3_status = ("holds at our scale" if gauge_rank == predicted_gauge and gauge_action <= 1e-2
             and near_zero[1e-3] >= predicted_gauge and gauge_in[1e-3][1] >= 0.99 else "differs")

# %% tags=["remove-cell"]
ledger.add(
    "X3",
    r"Per head $(W_Q, W_K) \to (W_Q A, W_K A^{-\top})$, $(W_V, W_O) \to (W_V B, B^{-1} W_O)$ "
    r"preserve the function (derived); gauge dimension $h(d_k^2 + d_v^2)$ per layer plus head "
    r"permutations; at a trained transformer the Hessian's action on the gauge, relative to "
    r"$\lambda_{\max}$, and the near-zero count against the prediction",
    f"tangent rank {gauge_rank} as derived; $\\Vert HQ\\Vert / \\lambda_{{\\max}}$ = "
    f"{fmt(gauge_action, 2)}; gauge share {fmt(gauge_in[1e-3][1], 2)} in the eigenspace below "
    "$10^{-3} \\lambda_{\\max}$",
    details={"output change, gauge / head swap": [rounding_level(g, 1e-13) for g in enc_gaps],
     "found by the registry, by kind / derived": [found_enc_counts, derived_enc_counts],
     "largest output change over the registry's symmetries": rounding_level(found_enc_gap, 1e-13),
     "gauge tangent rank / predicted": f"{gauge_rank} / {predicted_gauge}",
     "|H Q| / lambda_max": gauge_action, "gradient norm": grad_norm,
     "eigenvalues below 1e-2, 1e-3, 1e-4, 1e-6 lambda_max": list(near_zero.values()),
     "share of the gauge inside each of these eigenspaces": [gauge_in[t][1] for t in THRESHOLDS]},
    reported=r"the attention gauge $GL(d_k)^h \times GL(d_v)^h$ obscures Euclidean sharpness "
             "(da Silva, Dangel, Oore 2025)",
    sig=2, status=x3_status,
    note=f"one 2-head layer, $d_{{\\text{{model}}}} = {d_model}$, {n_encoder} parameters, memorising "
         r"$(a + b) \bmod 11$; the gauge is null only up to the gradient's size: the count holds "
         r"it at $10^{-3} \lambda_{\max}$, not below its Hessian action",
)

# %% [markdown]
# ## LayerNorm: a scale handed to the reader
#
# LayerNorm maps $x$ to $\gamma \odot n(x) + \beta$ with $n(x)$ the standardised $x$. A linear
# map $W$ that reads it sees $W(\gamma \odot n + \beta)$, so $(\gamma, \beta) \to c \odot
# (\gamma, \beta)$ with $W \to W \operatorname{diag}(c)^{-1}$ is exact, and leaves $\epsilon$
# inside $n$ untouched. A width-3 LayerNorm's affine part, with a generic standardised $n$:

# %%
nvec = sp.Matrix(sp.symbols("n1:4"))
g_, b_, cs = (sp.Matrix(sp.symbols(f"{s}1:4", positive=True)) for s in ("g", "b", "c"))
Wm = sp.Matrix(2, 3, sp.symbols("W1:7"))
ln_out = lambda gam_, bet_: gam_.multiply_elementwise(nvec) + bet_

# %% [markdown]
# read by $W$, before and after the move:

# %%
scaled_affine = ln_out(cs.multiply_elementwise(g_), cs.multiply_elementwise(b_))
rescaled = Wm * sp.diag(*cs).inv() * scaled_affine
assert sp.simplify(rescaled - Wm * ln_out(g_, b_)) == sp.zeros(2, 1)

# %% [markdown]
# In a pre-LN block the first LayerNorm feeds the query, key and value maps at once (one
# `in_proj_weight`), the second the FFN's first layer, and the final one the readout;
# `symmetries.layernorm_rescaling` moves each, and the outputs stay put. The registry
# reports the first two; the final one it lists as not audited ("{glue:text}`ch13-final-norm`"),
# though the same transform is exact there:

# %%
ln_readers = {"norm1 -> q, k, v": ("encoder.layers.0.norm1", f"{ATTN}.in_proj_weight"),
              "norm2 -> FFN": ("encoder.layers.0.norm2", "encoder.layers.0.linear1.weight"),
              "final norm -> readout": ("encoder.norm", "readout.weight")}
scales = torch.exp(torch.linspace(-1, 1, d_model))
ln_moves = {k: symmetries.layernorm_rescaling(a, [b], scales) for k, (a, b) in ln_readers.items()}

# %% [markdown]
# Each move against the trained outputs:

# %%
ln_gaps = {k: worst_gap(encoder, modular.x_test, [m]) for k, m in ln_moves.items()}
assert max(ln_gaps.values()) <= 1e-10
print(", ".join(f"{k}: {rounding_level(v, 1e-13)}" for k, v in ln_gaps.items()))

# %% tags=["remove-cell"]
glue_value("ch13-final-norm", next(r for r in found_enc.skipped if "final norm" in r).split(": ", 1)[1])
ledger.add(
    "X4",
    r"A LayerNorm feeding a linear map: $(\gamma, \beta) \to c(\gamma, \beta)$ with the map's "
    r"weight over $c$ is exact, $\epsilon$ untouched (derived); a pre-LN block inherits it for "
    r"$q, k, v$ and the MLP input",
    f"largest output change over three LayerNorms: {rounding_level(max(ln_gaps.values()), 1e-13)}",
    details={"largest output change, three LayerNorms": rounding_level(max(ln_gaps.values()), 1e-13),
     "scales c": f"exp(linspace(-1, 1, {d_model}))"},
    status="holds",
    note="an identity once derived: the numeric check confirms the transform is written right",
)

# %% [markdown]
# ## Which measures each symmetry moves
#
# We now recompute four measures at every moved model (the loss itself cannot move):
# $\lambda_{\max}$, the SAM sharpness {cite}`foret2021sharpness`, the elementwise-adaptive
# ASAM sharpness {cite}`kwon2021asam` (normalised by $|w| + \eta$ on every parameter named
# *weight*) and the Fisher-Rao norm {cite}`liang2019fisher`:

# %%
MEASURES = {"lambda_max": lambda m, d: curvature.lambda_max(m, CE, d, tol=1e-6),
            "SAM": lambda m, d: flatness.sam_sharpness(m, CE, d),
            "ASAM": lambda m, d: flatness.adaptive_sharpness(m, CE, d),
            "Fisher-Rao": lambda m, d: flatness.fisher_rao_norm(m, CE, d)}


# %% [markdown]
# Each measure after a move, over its value before:

# %%
def ratios(base, moved, d):
    before = {k: f(base, d) for k, f in MEASURES.items()}
    return {n: {k: f(m, d) / before[k] for k, f in MEASURES.items()} for n, m in moved.items()}


# %% [markdown]
# On the ResNet, with the BN scale drawn per channel this time:

# %%
resnet_ratios = ratios(resnet, moved_resnets, measure_data)
for name, row in resnet_ratios.items():
    print(f"{name:45s} " + "  ".join(f"{k} x{fmt(v, 3)}" for k, v in row.items()))

# %% [markdown]
# On the transformer, under the attention gauge, the head swap, the LayerNorm rescaling into
# $q, k, v$ and the FFN's ReLU rescaling:

# %%
gen = torch.Generator().manual_seed(2)
relu_c = torch.exp(2 * torch.rand(16, generator=gen) - 1)
enc_moves = {"attention gauge": gauge, "head swap": swap,
             "LN -> q, k, v": ln_moves["norm1 -> q, k, v"],
             "FFN ReLU rescaling": symmetries.relu_neuron_rescaling(
                 "encoder.layers.0.linear1", "encoder.layers.0.linear2", relu_c)}

# %% [markdown]
# The ratios at each move:

# %%
moved_encoders = {n: m.applied(encoder) for n, m in enc_moves.items()}
encoder_ratios = ratios(encoder, moved_encoders, train_data)
for name, row in encoder_ratios.items():
    print(f"{name:20s} " + "  ".join(f"{k} x{fmt(v, 3)}" for k, v in row.items()))

# %% [markdown]
# {numref}`fig-ch13-moves` draws both tables, each cell labelled with its factor
# after/before (the numbers printed above) and coloured on a logarithmic scale centred at 1,
# so that a factor and its inverse get opposite colours of the same strength:

# %% tags=["hide-input"]
from matplotlib.colors import LogNorm

moves_contract = MeasurementContract(
    centre="the trained DigitsResNet and ModularEncoder, eval mode",
    directions="lambda_max: Lanczos; SAM and ASAM: the (adaptive) gradient step; "
               "Fisher-Rao: the parameter vector",
    normalisation="ASAM: |w| + 0.01 on weights, 1 on biases (rho 0.5); SAM rho 0.05",
    radius="rho as stated", loss="cross-entropy",
    reduction=f"mean over {SIZES['n_measure']} digits / {len(modular.y_train)} pairs",
    data=f"{digits.description}; {modular.description}", model_mode="eval",
    resolution="one value per measure and move, printed to 3 significant digits",
    precision="float64")
tables = {"ResNet": resnet_ratios, "transformer": encoder_ratios}
span = max(abs(np.log10(r)) for table in tables.values() for row in table.values() for r in row.values())
norm = LogNorm(10**-span, 10**span)
labels = {"lambda_max": r"$\lambda_{\max}$", "SAM": "SAM", "ASAM": "ASAM", "Fisher-Rao": "Fisher-Rao"}
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), layout="constrained")
for ax, (title, table) in zip(axes, tables.items()):
    grid = np.array([list(row.values()) for row in table.values()])
    image = ax.imshow(grid, norm=norm, cmap="RdBu_r")
    for (i, j), r in np.ndenumerate(grid):
        ax.text(j, i, fmt(r, 3), ha="center", va="center", fontsize=8,
                color="white" if abs(np.log10(r)) > 0.6 * span else "black")
    ax.set_xticks(range(len(MEASURES)), [labels[k] for k in MEASURES], rotation=30, fontsize=8)
    ax.set_yticks(range(len(table)), list(table), fontsize=7)
    ax.grid(False)
    ax.set_title(title)
    ax.set_xlabel("measure")
axes[0].set_ylabel("function-preserving move")
ticks = [x for x in (0.25, 1 / 3, 0.5, 0.7, 1, 1.4, 2, 3, 4) if 10**-span <= x <= 10**span]
bar = fig.colorbar(image, ax=axes, label="factor after/before")
bar.set_ticks(ticks, labels=[fmt(x, 2) for x in ticks])
bar.ax.minorticks_off()
glue_figure("ch13-moves", fig, moves_contract,
            "The factor (after/before) by which each measure moves under each symmetry of a "
            "ResNet and of a transformer")

# %% [markdown]
# ```{glue:figure} fig-ch13-moves
# :name: fig-ch13-moves
#
# {glue:text}`cap-ch13-moves`
#
# {glue:md}`con-ch13-moves`
# ```
#
# What the tables show, as checks. Permutations keep every measure, and every move keeps the
# Fisher-Rao norm (to $10^{-8}$; $\lambda_{\max}$, which Lanczos stops at a relative error
# bound of $10^{-8}$ on each side of the ratio, to $10^{-6}$):

# %%
kept = lambda r, within=1e-8: abs(r - 1) <= within
perm_kept = all(kept(r, 1e-6 if m == "lambda_max" else 1e-8)
                for t in (resnet_ratios["block hidden-unit permutation"], encoder_ratios["head swap"])
                for m, r in t.items())
fr_kept = all(kept(row["Fisher-Rao"]) for t in (resnet_ratios, encoder_ratios) for row in t.values())
assert perm_kept and fr_kept

# %% [markdown]
# Under the attention gauge ASAM moves, by less than $\lambda_{\max}$ and SAM:

# %%
all_ratios = {**resnet_ratios, **encoder_ratios}
gauge_row = encoder_ratios["attention gauge"]
asam_gauge = gauge_row["ASAM"]
assert not kept(asam_gauge)
assert all(abs(np.log(asam_gauge)) < abs(np.log(gauge_row[k])) for k in ("lambda_max", "SAM"))

# %% [markdown]
# Three elementwise rescalings move ASAM further than the gauge does, and every rescaling
# moves SAM:

# %%
asam_by_more = ["BN affine through ReLU (block hidden units)", "residual-stream rescaling", "LN -> q, k, v"]
rescalings = [n for n in all_ratios if n not in ("block hidden-unit permutation", "head swap")]
assert all(abs(np.log(all_ratios[n]["ASAM"])) > abs(np.log(asam_gauge)) for n in asam_by_more)
assert all(abs(all_ratios[n]["SAM"] - 1) > 1e-2 for n in rescalings)

# %% tags=["remove-cell"]
for key, value in (("ch13-asam-gauge", asam_gauge),
                   ("ch13-asam-relu", encoder_ratios["FFN ReLU rescaling"]["ASAM"]),
                   ("ch13-lmax-gauge", encoder_ratios["attention gauge"]["lambda_max"]),
                   ("ch13-sam-gauge", encoder_ratios["attention gauge"]["SAM"]),
                   ("ch13-asam-affine", all_ratios[asam_by_more[0]]["ASAM"]),
                   ("ch13-asam-stream", all_ratios[asam_by_more[1]]["ASAM"]),
                   ("ch13-asam-ln", all_ratios[asam_by_more[2]]["ASAM"])):
    glue_value(key, value, 3)

# %% [markdown]
# Permutations keep every measure, and so does the Fisher-Rao norm under every move (its
# $\langle\theta, g_i\rangle$ is unchanged by any linear change of coordinates that keeps
# the function). Under the attention gauge, $\lambda_{\max}$ changes by a factor
# {glue:text}`ch13-lmax-gauge`, SAM by {glue:text}`ch13-sam-gauge` and ASAM by
# {glue:text}`ch13-asam-gauge`: ASAM moves, by less than the Euclidean measures, because its
# elementwise normalisation $|w| + \eta$ cannot follow a change of basis that mixes the
# entries of a head {cite}`dasilva2025hide`; with a diagonal $A$ (second exercise) it
# nearly stays. The gauge is not what moves ASAM most, though: the BN-affine rescaling moves
# it by {glue:text}`ch13-asam-affine`, the residual-stream one by {glue:text}`ch13-asam-stream`
# and the LayerNorm one by {glue:text}`ch13-asam-ln`, all elementwise, and the FFN's ReLU
# rescaling by {glue:text}`ch13-asam-relu`. What decides it is which coordinates ASAM
# normalises: $T = |w| + \eta$ on every parameter named *weight* (normalisation gains
# included, as in the authors' implementation) and 1 on every other one, the biases. A
# rescaling that also scales a bias ($\beta$ of a BatchNorm or LayerNorm, a linear layer's
# bias) is one $T$ cannot follow. To separate this from $\eta$, we recompute ASAM with
# $\eta = 0$ for every rescaling, and list the parameters each one changes that $T$ leaves
# unnormalised:

# %%
asam_exact = lambda m, d: flatness.adaptive_sharpness(m, CE, d, eta=0.0)
def unnormalised_changed(base, moved):
    return [k for k, p in base.named_parameters()
            if "weight" not in k and not torch.equal(p, moved.get_parameter(k))]


# %% [markdown]
# For every rescaling of either network:

# %%
asam_eta0, unnormalised = {}, {}
for base, moved, d in ((resnet, moved_resnets, measure_data), (encoder, moved_encoders, train_data)):
    at_zero = asam_exact(base, d)
    for name in [n for n in moved if n in rescalings]:
        asam_eta0[name] = asam_exact(moved[name], d) / at_zero
        unnormalised[name] = unnormalised_changed(base, moved[name])
weights_only = [n for n in rescalings if n != "attention gauge" and not unnormalised[n]]

# %%
for name in rescalings:
    at_zero = (rounding_level(abs(asam_eta0[name] - 1), 1e-12) if kept(asam_eta0[name])
               else f"x{fmt(asam_eta0[name], 3)}")
    print(f"{name:45s} ASAM eta = 0.01 x{fmt(all_ratios[name]['ASAM'], 4):6s} eta = 0 {at_zero:>6s}; "
          f"unnormalised parameters changed: {len(unnormalised[name])}")

# %% [markdown]
# The rescalings that change parameters named *weight* only, and whether ASAM keeps them
# at $\eta = 0$ and moves under every other one at both values of $\eta$:

# %%
x5_kept = all(kept(asam_eta0[n]) for n in weights_only)
x5_moved = all(abs(asam_eta0[n] - 1) > 1e-3 and abs(all_ratios[n]["ASAM"] - 1) > 1e-3
               for n in rescalings if n not in weights_only)
assert weights_only == ["BN scale (all 6 BN layers)"] and x5_kept and x5_moved

# %% tags=["remove-cell"]
glue_value("ch13-asam-bn", all_ratios[weights_only[0]]["ASAM"], 4)
glue_value("ch13-asam-bn-exact", rounding_level(abs(asam_eta0[weights_only[0]] - 1), 1e-12))

# %% [markdown]
# The per-channel BN scale is the one rescaling here that changes only parameters named
# *weight* (and the running statistics, which are no parameters): at $\eta = 0$ its ASAM
# ratio differs from 1 by {glue:text}`ch13-asam-bn-exact`; at the default $\eta = 0.01$ it moves
# it by a factor {glue:text}`ch13-asam-bn`, $\eta$'s share. Every rescaling that also
# changes a bias moves ASAM at $\eta = 0$ as at $\eta = 0.01$, and so does the gauge. ASAM
# survives the elementwise rescalings of weights, as it is built to, and neither those that
# reach a bias nor the attention gauge. X5's criterion: at $\eta = 0$ every elementwise
# rescaling of weights alone keeps ASAM within $10^{-8}$, and every other rescaling and the
# gauge move it by more than $10^{-3}$ at both values of $\eta$.

# %%
x5_status = "holds at our scale" if weights_only and x5_kept and x5_moved else "differs"

# %% tags=["remove-cell"]
bias_moves = [n for n in rescalings if n not in weights_only and n != "attention gauge"]
bias_asam = [all_ratios[n]["ASAM"] for n in bias_moves]
bias_eta0 = [asam_eta0[n] for n in bias_moves]
ledger.add(
    "X5",
    r"Which measures each symmetry moves, on a trained BN ResNet and a trained transformer: "
    r"ASAM ($T = |w| + \eta$ on parameters named weight, 1 on biases) is kept, exactly at "
    r"$\eta = 0$, by elementwise rescalings of weights alone, and moved by rescalings that also "
    r"scale a bias and by the attention gauge",
    f"ASAM at $\\eta = 0$: BN scale {rounding_level(abs(asam_eta0[weights_only[0]] - 1), 1e-12)}; "
    f"gauge $\\times${fmt(asam_eta0['attention gauge'], 3)}; bias-reaching "
    f"$\\times${fmt(min(bias_eta0), 3)} to $\\times${fmt(max(bias_eta0), 3)}",
    details={"ResNet ratios (lambda_max, SAM, ASAM, Fisher-Rao)":
         {n: list(r.values()) for n, r in resnet_ratios.items()},
     "transformer ratios (lambda_max, SAM, ASAM, Fisher-Rao)":
         {n: list(r.values()) for n, r in encoder_ratios.items()},
     "ASAM ratio at eta = 0": {n: asam_eta0[n] for n in rescalings},
     "rescalings of weights alone": weights_only},
    reported="adaptive sharpness is not invariant under $GL(h)$ (da Silva, Dangel, Oore 2025); "
             "ASAM is invariant under elementwise rescalings of weights (Kwon et al. 2021)",
    sig=3, status=x5_status,
    note=f"ASAM kept by the BN scale (weights only; exactly at $\\eta = 0$, "
         f"$\\times${fmt(all_ratios[weights_only[0]]['ASAM'], 4)} at $\\eta = 0.01$); moved by the "
         f"gauge ($\\times${fmt(asam_gauge, 3)}) and by every rescaling that also scales a bias "
         f"($\\times${fmt(min(bias_asam), 3)} to $\\times${fmt(max(bias_asam), 3)}), which $T$ "
         "leaves unnormalised",
)

# %% [markdown]
# ## Does the rank correlation with the gap survive?
#
# Last, the practical question {cite}`jiang2020fantastic`. We train
# {glue:text}`ch13-family-n` small BatchNorm MLPs on digits (`arch.DigitsBNMLP`: width,
# learning rate, batch size, weight decay and seed all varied, `arch.family_settings`),
# take each one's generalisation gap as *test minus training cross-entropy* in eval mode,
# and compute the Kendall $\tau$ of each measure with the gap: at the trained parameters, and
# again after all the model's BN moves (both BN scales and both BN-affine rescalings, sizes
# in $[1/3, 3]$, drawn per model):

# %%
family = arch.family_study(digits, arch.family_settings(SIZES["family"], 150), MEASURES,
                           measure_data)
assert family.output_gap <= 1e-10 and len(family.gaps) >= 16

# %% [markdown]
# The family's gaps, and each measure's $\tau$ (with its $p$-value) before and after the moves:

# %%
print(f"{len(family.gaps)} models; gap from {fmt(family.gaps.min(), 3)} to "
      f"{fmt(family.gaps.max(), 3)}; outputs moved by {rounding_level(family.output_gap, 1e-13)}")
for k in MEASURES:
    (tb, pb), (ta, pa) = family.tau_before[k], family.tau_after[k]
    print(f"{k:10s} tau {fmt(tb, 2):>6} (p {fmt(pb, 2)}) -> {fmt(ta, 2):>6} (p {fmt(pa, 2)})")

# %% tags=["hide-input"]
family_contract = MeasurementContract(
    centre="each trained DigitsBNMLP of the family, eval mode, and its BN-moved twin",
    directions="as in the measures' definitions", normalisation="ASAM |w| + 0.01; SAM none",
    radius="SAM rho 0.05, ASAM rho 0.5", loss="cross-entropy",
    reduction=f"mean over {SIZES['n_measure']} training examples",
    data=digits.description, model_mode="eval", precision="float64",
    resolution=f"{len(family.gaps)} models, gap = test - train cross-entropy")
fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
for ax, key in zip(axes, ("lambda_max", "ASAM")):
    ax.scatter(family.gaps, family.before[key], label="trained")
    ax.scatter(family.gaps, family.after[key], marker="x", label="after BN moves")
    ax.set_yscale("log")
    ax.set_xlabel("generalisation gap (test - train cross-entropy)")
    ax.set_ylabel(key)
axes[0].legend(fontsize=8)
glue_figure("ch13-family", fig, family_contract,
            "Two measures against the generalisation gap over a family, before and after BN moves")

# %% [markdown]
# ```{glue:figure} fig-ch13-family
# :name: fig-ch13-family
#
# {glue:text}`cap-ch13-family`
#
# {glue:md}`con-ch13-family`
# ```
#
# Which $\tau$ are significant at the 5% level after a Bonferroni correction over the
# measures:

# %%
ALPHA = 0.05 / len(MEASURES)
taus = {"before": family.tau_before, "after": family.tau_after}
significant = {when: [k for k in MEASURES if t[k][1] < ALPHA] for when, t in taus.items()}
smallest_p = min(t[k][1] for t in taus.values() for k in MEASURES)

# %% [markdown]
# Which $\tau$ the moves change (at the two digits printed), and which they cannot:

# %%
changed = [k for k in MEASURES if fmt(family.tau_before[k][0], 2) != fmt(family.tau_after[k][0], 2)]
assert family.tau_after["Fisher-Rao"][0] == family.tau_before["Fisher-Rao"][0]
assert "lambda_max" in changed and "Fisher-Rao" not in changed

# %% [markdown]
# X6's status, read from the significant $\tau$ of the measures other than the Fisher-Rao
# norm:

# %%
sharp_found = [k for k in significant["before"] if k != "Fisher-Rao"]
x6_status = "holds at our scale" if sharp_found else "not reproduced"

# %% tags=["remove-cell"]
verdict = (f"{', '.join(sharp_found)} predicts the gap at this size" if sharp_found else
           "at this size the family cannot say that any measure predicts the gap, so the "
           "correlation reported for sharpness is not reproduced here")
glue_value("ch13-family-n", len(family.gaps))
glue_value("ch13-alpha", ALPHA, 3)
glue_value("ch13-significant", ", ".join(significant["before"]) or "none")
glue_value("ch13-significant-after", ", ".join(significant["after"]) or "none")
glue_value("ch13-smallest-p", smallest_p, 2)
glue_value("ch13-family-verdict", verdict)
glue_value("ch13-x6-status", x6_status)
glue_value("ch13-tau-lmax", fmt(family.tau_before["lambda_max"][0], 2))
glue_value("ch13-tau-lmax-after", fmt(family.tau_after["lambda_max"][0], 2))

# %% [markdown]
# {numref}`fig-ch13-family` shows two of the measures. X6's criterion: a measure predicts the
# gap here when its $\tau$ is significant at the 5% level after a Bonferroni correction over
# the four measures ($p$ below {glue:text}`ch13-alpha`). Over {glue:text}`ch13-family-n`
# models the measures that do are: {glue:text}`ch13-significant` before the moves and
# {glue:text}`ch13-significant-after` after them (smallest $p$ {glue:text}`ch13-smallest-p`);
# {glue:text}`ch13-family-verdict` (status: {glue:text}`ch13-x6-status`).
# {cite:t}`jiang2020fantastic` found sharpness-based measures among the better predictors over
# a far larger family of CNNs, {cite:t}`andriushchenko2023modern` that sharpness does not
# reliably predict generalisation. What the moves show is different: the same
# {glue:text}`ch13-family-n` functions give $\lambda_{\max}$ a $\tau$ of
# {glue:text}`ch13-tau-lmax` or {glue:text}`ch13-tau-lmax-after` depending on coordinates the
# functions do not see, while the Fisher-Rao norm's $\tau$ cannot change.

# %% tags=["remove-cell"]
tex = lambda names: ", ".join(r"$\lambda_{\max}$" if k == "lambda_max" else k for k in names)
ledger.add(
    "X6",
    r"Over a family of small trained models (width, learning rate, batch size, weight decay, "
    r"seed varied), Kendall $\tau$ of each measure with the generalisation gap (test $-$ train "
    r"cross-entropy), before and after function-preserving moves",
    f"{len(family.gaps)} models; significant $\\tau$: {tex(significant['before']) or 'none'} "
    f"(smallest $p$ = {fmt(smallest_p, 2)}, level {fmt(ALPHA, 3)})",
    details={"models": len(family.gaps),
     "tau before (lambda_max, SAM, ASAM, Fisher-Rao)": [family.tau_before[k][0] for k in MEASURES],
     "tau after": [family.tau_after[k][0] for k in MEASURES],
     "p-values before": [family.tau_before[k][1] for k in MEASURES],
     "p-values after": [family.tau_after[k][1] for k in MEASURES],
     "significant at 5% after Bonferroni over 4, before / after":
         [significant["before"], significant["after"]]},
    reported="Jiang et al. 2020: sharpness-based measures among the better predictors over "
             "10,000+ CNNs; Andriushchenko et al. 2023: sharpness does not reliably predict "
             "generalisation",
    sig=2, status=x6_status,
    note=f"{len(family.gaps)} BN MLPs on {SIZES['n_train']} digits: "
         + ("no $\\tau$ significant (smallest $p$ " + fmt(smallest_p, 2) + "), so the reported "
            "correlation is not reproduced at this size" if not sharp_found
            else tex(sharp_found) + " significant")
         + f"; the moves change $\\tau$ for {tex(changed)}, not the Fisher-Rao norm",
)

# %% [markdown]
# ## What this establishes
#
# ```{admonition} What you now know, and what does not follow
# :class: important
# **You now know**
#
# - The BatchNorm scale, the BN-affine and residual-stream rescalings, the attention gauge and
#   the LayerNorm rescaling are exact symmetries of the trained networks, derived with sympy
#   and checked to rounding; the registry finds most of them, and their number follows from
#   the architecture.
# - Each one moves Euclidean sharpness ($\lambda_{\max}$, SAM). The elementwise-adaptive ASAM
#   survives only the rescaling of weights alone (exactly at $\eta = 0$) and moves under the
#   attention gauge and under every rescaling that reaches a bias. Only the Fisher-Rao norm,
#   among the measures here, survives every move.
# - At a trained point the gauge is near-null, not null: the Hessian feels it at the size of
#   the gradient, and a count of near-zero eigenvalues holds it only at a threshold above that.
# - The rank correlation of a measure that is not invariant with the generalisation gap
#   depends on coordinates the functions do not see.
#
# **What does not follow**
#
# - Anything at the scale of the cited studies: the family has {glue:text}`ch13-family-n`
#   small models, the transformer one layer and the ResNet two blocks (X6's verdict:
#   {glue:text}`ch13-family-verdict`).
# - That a measure which survives every move, like the Fisher-Rao norm, predicts
#   generalisation: invariance makes its $\tau$ well defined, not significant.
# ```
#
# ## Exercises
#
# ```{admonition} Exercise: how low can a uniform scale go?
# :class: tip
# Predict $\lambda_{\max}$ of the ResNet at $c = 100$ from the sweep. (Hint: which block's
# curvature is left?)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# For large $c$ the rescaled block's curvature falls as $c^{-2}$, and $\lambda_{\max}$ tends to
# that of the BatchNorm affines and the readout, so it stays close to its value at $c = 10$.
# The cell below checks it.
# ```

# %% tags=["hide-cell"]
lmax_100 = curvature.lambda_max(scaled(resnet, 100.0).applied(resnet), CE, measure_data, tol=1e-6)
assert abs(lmax_100 / sweep_lmax[10.0] - 1) < 0.5
print(f"lambda_max at c = 100: {fmt(lmax_100, 3)} (at c = 10: {fmt(sweep_lmax[10.0], 3)})")

# %% [markdown]
# ```{admonition} Exercise: a diagonal gauge
# :class: tip
# Take $A = \operatorname{diag}(a)$ with positive $a$ and $B = I$. Does ASAM move?
# (Hint: ASAM's $T = |w| + \eta$ is elementwise.)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# A diagonal $A$ rescales the query rows by $a$ and the key rows by $1/a$, an elementwise
# rescaling, so ASAM moves only through $\eta$ and the biases, by much less than under a
# full $A$. The cell below measures it.
# ```

# %% tags=["hide-cell"]
diag_A = [torch.diag(torch.linspace(0.5, 2.0, dh)) for _ in range(n_heads)]
eye_B = [torch.eye(dh) for _ in range(n_heads)]
diag_moved = head_gauges(diag_A, eye_B, "diagonal gauge").applied(encoder)
diag_ratio = MEASURES["ASAM"](diag_moved, train_data) / MEASURES["ASAM"](encoder, train_data)
assert abs(diag_ratio - 1) < abs(asam_gauge - 1)
print(f"ASAM ratio, diagonal gauge: {fmt(diag_ratio, 3)} (full gauge {fmt(asam_gauge, 3)})")

# %% [markdown]
# ## Results ledger

# %%
ledger

# %% [markdown]
# X7-X12 (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, geodesic sharpness)
# are the subject of {ref}`the next chapter <ch-decoder-transformers>`.
