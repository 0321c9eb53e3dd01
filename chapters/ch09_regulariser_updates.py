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
# (ch-regulariser-updates)=
# # A regulariser must move equivalent models alike
#
# A flatness proxy added to the training loss is an intervention: it changes how the
# predictor moves. If the proxy measured a property of the predictor, two parameter points
# that implement the same predictor would have to be moved in the same way. This chapter
# tests that requirement on the last-layer proxies of {numref}`Chapter %s <ch-softmax-gauge>`: the raw
# bound $B_{\mathrm{raw}}$, its centred (quotient) version $B_{\mathrm{quot}}$, and the
# exact contraction $\kappa_{\mathrm{exact}}$ of relative flatness {cite}`petzka2021relative`,
# used as a regulariser in grokking studies {cite}`han2025flatness`. Following the analysis of
# {cite:t}`opazo2026flatness`, we derive in closed form how the raw proxy moves the class
# probabilities of two equivalent classifiers, show that no rescaling of the regulariser
# aligns them, derive the runaway of the function-null mean row under the
# sharpness-raising intervention, and then run paired one-step tests and long training
# runs on small models trained here: a one-layer transformer on modular addition
# {cite}`power2022grokking`, an MLP on modular subtraction, and digit classifiers.
#
# **Claims established here:** S10, S11, S12, S13.
#
# We load the tools once. Torch runs on one thread so that every reduction happens in one
# order and the printed numbers are reproducible:

# %%
import functools
import math

import numpy as np
import sympy as sp
import torch
import matplotlib.pyplot as plt
from IPython.display import Math, display
from myst_nb import glue

from lossgeom import regularisers as reg
from lossgeom import softmax, tasks
from lossgeom.contract import MeasurementContract
from lossgeom.data import Split, digits
from lossgeom.display import fmt, glue_figure, use_book_style
from lossgeom.ledger import Ledger

torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)
use_book_style()
ledger = Ledger("Chapter 9: a regulariser must move equivalent models alike")
W_NAME = tasks.CLASSIFIER

# %% [markdown]
# ## The velocity of a regulariser
#
# Let $F(\theta)$ be the model's class probabilities on a fixed probe set and $S(\theta)$ a
# score added to the loss. Gradient descent on $S$ with step $\eta$ moves the outputs by
# $-\eta\,\mathcal V_S + O(\eta^2)$, where
#
# $$
# \mathcal V_S(\theta) = J_F(\theta)\, \nabla_\theta S(\theta)
# $$ (eq-ch09-velocity)
#
# is the *functional velocity* of $S$. `lossgeom.regularisers.functional_velocity`
# computes it without forming $J_F$: `torch.func.grad` gives $\nabla_\theta S$ and one
# forward-mode product `torch.func.jvp` pushes it through $F$. For a classifier
# $W \in \mathbb R^{K\times d}$ on features $h$, with $p = \operatorname{softmax}(Wh)$ and
# $P(p) = \operatorname{Diag}(p) - pp^\top$, write
# $s(W, h) = \lVert h\rVert^2 (1 - \lVert p\rVert^2)$, so that
# $B_{\mathrm{raw}} = \lVert W\rVert_F^2\, s$ and $B_{\mathrm{quot}} = \lVert W_c\rVert_F^2\, s$ with
# $W_c$ the row-centred classifier. The common-row shift $W \mapsto W + \mathbf 1 v^\top$
# leaves $p$, $s$, $B_{\mathrm{quot}}$ and $\kappa_{\mathrm{exact}}$ unchanged and changes
# $\lVert W\rVert_F^2$ by $\Delta_v = \lVert W + \mathbf 1 v^\top\rVert_F^2 - \lVert W\rVert_F^2$.
#
# ## The raw proxy moves equivalent models apart
#
# Three facts carry the derivation. Sympy checks the first two exactly for $K = 3$: the
# softmax Jacobian is $P(p)$, and a common shift of the logits leaves $p$ unchanged. An
# entry counts as zero when expanding it, merging the exponentials and cancelling the
# resulting rational function leaves exactly 0 (`vanishes`):

# %%
K = 3
vanishes = lambda M: all(sp.cancel(sp.powsimp(sp.expand(e))) == 0 for e in M)
z = sp.Matrix(sp.symbols("z1:4", real=True))
c_shift = sp.symbols("c", real=True)
softmax_of = lambda logits: logits.applyfunc(sp.exp) / sum(logits.applyfunc(sp.exp))
p_z = softmax_of(z)
P_z = sp.diag(*p_z) - p_z * p_z.T
assert vanishes(p_z.jacobian(z) - P_z)
assert vanishes(softmax_of(z + c_shift * sp.ones(K, 1)) - p_z)
display(Math(r"\frac{\partial p}{\partial z} = \operatorname{Diag}(p) - p p^\top = P(p), \qquad "
             r"\operatorname{softmax}(z + c\mathbf 1) = \operatorname{softmax}(z)"))

# %% [markdown]
# Both hold for every $z$. The third fact is the chain rule through $z = Wh$: a change
# $\delta W$ moves the logits by $\delta W\, h$, so the probability Jacobian in $W$ acts as
# $J_{p,W}[\delta W] = P(p)\,\delta W\, h$. With $\partial s/\partial z = -2\lVert h\rVert^2 P(p)p$
# this gives $\nabla_W s = -2\lVert h\rVert^2 P(p) p\, h^\top$, and the product rule gives
# $\nabla_W B_{\mathrm{raw}} = 2sW + \lVert W\rVert_F^2 \nabla_W s$. Sympy derives
# $\partial s/\partial z$ and then evaluates the velocity difference between $W + \mathbf 1v^\top$
# and $W$ on symbols $p$, $h$, $v$, where $s$ and $\nabla_W s$ are the same at both points:

# %%
hz = sp.Matrix(sp.symbols("h1:3", real=True))
n2 = (hz.T * hz)[0]
s_z = n2 * (1 - (p_z.T * p_z)[0])
assert vanishes(sp.Matrix([s_z.diff(zi) for zi in z]) - (-2 * n2 * P_z * p_z))

p_sym = sp.Matrix(sp.symbols("p1:4", positive=True))
v_sym = sp.Matrix(sp.symbols("v1:3", real=True))
P = sp.diag(*p_sym) - p_sym * p_sym.T
s_sym, delta_v = sp.symbols("s Delta_v", real=True)
grad_s = -2 * n2 * P * p_sym * hz.T
J_pW = lambda dW: P * dW * hz
grad_gap = 2 * s_sym * sp.ones(K, 1) * v_sym.T + delta_v * grad_s   # grad B_raw(W + 1 v^T) - grad B_raw(W)
velocity_gap = J_pW(grad_gap).subs(p_sym[2], 1 - p_sym[0] - p_sym[1])
claimed = (-2 * delta_v * n2**2 * P * P * p_sym).subs(p_sym[2], 1 - p_sym[0] - p_sym[1])
assert sp.expand(velocity_gap - claimed) == sp.zeros(K, 1)
display(Math(r"J_{p,W}\,\big(\nabla_W B_{\mathrm{raw}}(W + \mathbf 1 v^\top) - \nabla_W B_{\mathrm{raw}}(W)\big)"
             r" = -2\,\Delta_v\, \lVert h\rVert^4\, P(p)^2 p"))


# %% [markdown]
# The function-null term $2s\mathbf 1 v^\top$ drops out because $P(p)\mathbf 1 = 0$ once the
# probabilities sum to one; what remains is $-2\Delta_v\lVert h\rVert^4 P(p)^2p$, which
# vanishes only if $\Delta_v = 0$ or $P(p)p = 0$, that is $p$ uniform. We check the formula
# with autograd at random classifiers ($K = 3$ and $K = 10$), taking $h$ and $v$ at random
# and computing both velocities with `functional_velocity`:

# %%
def raw_velocity_gap(K, d, seed):
    g = torch.Generator().manual_seed(seed)
    W, h, v = torch.randn(K, d, generator=g), torch.randn(d, generator=g), 2 * torch.randn(d, generator=g)
    F = lambda q: softmax.probabilities(q["W"], h)
    score = lambda q: softmax.b_raw(q["W"], h)
    gap = (reg.functional_velocity(F, score, {"W": softmax.common_row_shift(W, v)})
           - reg.functional_velocity(F, score, {"W": W}))
    p = softmax.probabilities(W, h)
    Pp = softmax.covariance(p)
    delta = (softmax.common_row_shift(W, v) ** 2).sum() - (W**2).sum()
    formula = -2 * delta * (h @ h) ** 2 * Pp @ Pp @ p
    return float((gap - formula).abs().max() / formula.abs().max()), float(formula.abs().max())


checks = [raw_velocity_gap(K_, d_, seed) for K_, d_ in ((3, 4), (10, 6)) for seed in range(3)]
worst_rel = max(c[0] for c in checks)
assert worst_rel <= 1e-10 and min(c[1] for c in checks) > 1e-6
print(f"6 random (W, h, v), K in {{3, 10}}: largest relative deviation of the autograd velocity gap "
      f"from -2 Delta_v |h|^4 P(p)^2 p is below 1e-10; the gaps themselves are of size "
      f"{fmt(min(c[1] for c in checks), 3)} to {fmt(max(c[1] for c in checks), 3)}")


# %% [markdown]
# Autograd and the closed form agree, and the velocity gap is far from zero at every
# sampled point: two names for one predictor are pushed in different functional directions.
#
# ## No rescaling of the regulariser aligns the updates
#
# Could a per-model choice of the coefficient $\alpha$ repair this? Along one orbit,
# $a = s$ and its gradient are invariant, so with $c = \lVert W\rVert_F^2$
#
# $$
# \mathcal V_{B_{\mathrm{raw}}} = A + c\,B, \qquad A = 2s\, J_{p,W}\operatorname{vec}(W),\quad B = J_{p,W}\operatorname{vec}(\nabla_W s),
# $$ (eq-ch09-split)
#
# with $A$ and $B$ the same at every representative. If $A$ and $B$ are linearly
# independent, $\lambda_1 (A + c_1 B) = \lambda_2 (A + c_2 B)$ forces $\lambda_1 = \lambda_2$ and
# then $c_1 = c_2$: no two scalars align two representatives with different norms. For one
# fixed feature, $J_{p,W}\operatorname{vec}(W) = P(p)Wh = P(p)\log p$ (the logits are
# $\log p$ up to a common constant, which $P$ removes) and $B = -2\lVert h\rVert^4 P(p)^2 p$, so
# independence is decided by the $K \times 2$ matrix $[P(p)\log p,\ P(p)^2p]$. For $K = 3$
# we take the minor of its first two rows at $p = (1/2, 3/10, 1/5)$ exactly, writing each
# logarithm in the prime basis $\log 2, \log 3, \log 5$ so that equality is decided
# coefficient by coefficient:

# %%
def prime_log(q):
    """log of a positive rational as an exact sum of log(prime) terms."""
    q = sp.Rational(q)
    return sum(e * sp.log(b) for b, e in sp.factorint(q.p).items()) - sum(e * sp.log(b) for b, e in sp.factorint(q.q).items())


def first_minor(p_vec, log=sp.log):
    p_vec = sp.Matrix(p_vec)
    Pm = sp.diag(*p_vec) - p_vec * p_vec.T
    A_vec, B_vec = Pm * p_vec.applyfunc(log), Pm * Pm * p_vec
    return sp.expand(A_vec[0] * B_vec[1] - A_vec[1] * B_vec[0])


p_star = [sp.Rational(1, 2), sp.Rational(3, 10), sp.Rational(1, 5)]
minor_star = first_minor(p_star, log=prime_log)
reported_minor = sp.Rational(9, 25000) * prime_log(sp.Rational(640, 6561))
assert sp.expand(minor_star - reported_minor) == 0
display(Math(r"M(1/2, 3/10, 1/5) = " + sp.latex(minor_star) + r" = \tfrac{9}{25000}\log\tfrac{640}{6561} = "
             + sp.latex(sp.N(minor_star, 12))))
glue("ch09-minor", float(minor_star), display=False)

# %% [markdown]
# The minor equals the reported $\tfrac{9}{25000}\log(640/6561)$ exactly, with the minor
# taken as $A_1B_2 - A_2B_1$ for $A = P(p)\log p$ and $B = P(p)^2p$ (the nonzero factors
# $2s$ and $-2\lVert h\rVert^4$ only rescale it). Its value is {glue:text}`ch09-minor:.6g`, not
# zero, so the two directions are independent there. The minor is analytic on the open
# simplex, so its zero set has measure zero once it is nonzero somewhere; a random sample
# of the simplex shows how rarely it comes close to zero, and the uniform point shows that
# zeros do exist:

# %%
rng = np.random.default_rng(9)
p_random = rng.dirichlet(np.ones(3), size=20000)
P_random = np.einsum("ni,ij->nij", p_random, np.eye(3)) - np.einsum("ni,nj->nij", p_random, p_random)
A_random = np.einsum("nij,nj->ni", P_random, np.log(p_random))
B_random = np.einsum("nij,njk,nk->ni", P_random, P_random, p_random)
minor_random = np.abs(A_random[:, 0] * B_random[:, 1] - A_random[:, 1] * B_random[:, 0])
minor_uniform = first_minor([sp.Rational(1, 3)] * 3)
assert minor_uniform == 0 and np.all(minor_random > 0)
frac_tiny = float(np.mean(minor_random < 1e-8))
print(f"20000 Dirichlet(1,1,1) draws: the minor is nonzero at every one; median |M| = "
      f"{fmt(np.median(minor_random), 3)}, fraction with |M| < 1e-8: {fmt(frac_tiny, 3)}; at p uniform M = 0 exactly")

# %% [markdown]
# Every sampled $p$ gives a nonzero minor. Finally, we watch the decomposition
# {eq}`eq-ch09-split` happen in autograd on one fixed feature with $K = 10$: three
# representatives with $c = \lVert W\rVert_F^2$ equal to 1, 10 and 100 times the centred value
# have velocities that lie on one line $A + cB$, and the angle between any two of them is
# not zero, so no pair of scalars maps one onto the other:

# %%
g = torch.Generator().manual_seed(1)
W10 = softmax.centre(torch.randn(10, 6, generator=g))
h10 = torch.randn(6, generator=g)
direction = torch.randn(6, generator=g)
F10 = lambda q: softmax.probabilities(q["W"], h10)
reps = {r: softmax.common_row_shift(W10, reg.shift_for_ratio(W10, r, direction)) for r in (1.0, 10.0, 100.0)}
vel = {r: reg.functional_velocity(F10, lambda q: softmax.b_raw(q["W"], h10), {"W": Wr}) for r, Wr in reps.items()}
norms = {r: float((Wr**2).sum()) for r, Wr in reps.items()}
B_dir = (vel[100.0] - vel[10.0]) / (norms[100.0] - norms[10.0])
A_dir = vel[1.0] - norms[1.0] * B_dir
line_error = float((A_dir + norms[10.0] * B_dir - vel[10.0]).abs().max() / vel[10.0].abs().max())
cosine = lambda a, b: float(a @ b / (a.norm() * b.norm()))
sines = {f"{a:g}x vs {b:g}x": math.sqrt(max(0.0, 1 - cosine(vel[a], vel[b]) ** 2)) for a, b in ((1.0, 10.0), (1.0, 100.0), (10.0, 100.0))}
assert line_error <= 1e-10 and min(sines.values()) > 1e-3
print(f"collinearity A + cB: relative error below 1e-10; sine of the angle between velocities: "
      + ", ".join(f"{k} {fmt(v, 4)}" for k, v in sines.items()))
ledger.add("S10", "Raw-proxy velocity gap -2 Delta_v |h|^4 P(p)^2 p; no scalar retuning aligns equivalent updates; K=3 minor",
           {"velocity formula": "exact (sympy); autograd rel. dev. < 1e-10 on 6 random cases",
            "minor at (1/2,3/10,1/5)": str(minor_star), "minor value": float(minor_star),
            "random p with nonzero minor": "20000 of 20000", "min sine between representatives": min(sines.values())},
           reported="(9/25000) log(640/6561)")

# %% [markdown]
# The three velocities are collinear in the sense of {eq}`eq-ch09-split` to rounding, yet no
# two point the same way: retuning $\alpha$ per representative cannot align them.
#
# ## The function-null mean row runs away
#
# Take the intervention the other way round: gradient *ascent* on $\alpha B_{\mathrm{raw}}$,
# the sharpness-raising regulariser, inside plain SGD with step $\eta$ and (coupled) weight
# decay $\lambda$. Write the objective as $\mathrm{CE} + \sigma\alpha B$ with $\sigma = +1$
# for a flatness penalty and $\sigma = -1$ for the sharpness-raising ascent. The
# cross-entropy gradient $(p - e_y)h^\top$ and $\nabla_W s = -2\lVert h\rVert^2P(p)ph^\top$ both
# have zero column sums, since $\mathbf 1^\top(p - e_y) = 0$ and $\mathbf 1^\top P(p) = 0$.
# Sympy checks these two facts and then takes the mean row of one SGD step on a generic
# $3 \times 2$ classifier, with the zero-mean gradients written as $\Pi M$ for arbitrary $M$
# ($\Pi = I - \mathbf 1\mathbf 1^\top/K$):

# %%
ones = sp.ones(K, 1)
p_simplex = {p_sym[2]: 1 - p_sym[0] - p_sym[1]}
assert sp.expand((ones.T * P).subs(p_simplex)) == sp.zeros(1, K)
assert sp.expand((ones.T * (p_sym - sp.Matrix([0, 1, 0]))).subs(p_simplex)) == sp.zeros(1, 1)

eta, alpha, lam, s_t = sp.symbols("eta alpha lambda s_t", positive=True)
W_sym = sp.Matrix(K, 2, sp.symbols("w1:7", real=True))
Pi = sp.eye(K) - ones * ones.T / K
G_ce, G_s = Pi * sp.Matrix(K, 2, sp.symbols("m1:7")), Pi * sp.Matrix(K, 2, sp.symbols("n1:7"))
mean_row = lambda M: (ones.T * M / K).T
frob2 = lambda M: sum(M.multiply_elementwise(M))
factors = {}
for sigma in (1, -1):
    grad_raw = 2 * s_t * W_sym + frob2(W_sym) * G_s
    step = W_sym - eta * (G_ce + sigma * alpha * grad_raw + lam * W_sym)
    factor = 1 - eta * lam - 2 * sigma * eta * alpha * s_t
    assert sp.expand(mean_row(step) - factor * mean_row(W_sym)) == sp.zeros(2, 1)
    Wc_sym = Pi * W_sym
    grad_quot = 2 * s_t * Wc_sym + frob2(Wc_sym) * G_s
    step_quot = W_sym - eta * (G_ce + sigma * alpha * grad_quot + lam * W_sym)
    assert sp.expand(mean_row(step_quot) - (1 - eta * lam) * mean_row(W_sym)) == sp.zeros(2, 1)
    factors[sigma] = factor
display(Math(r"\bar w_{t+1} = \Big(" + sp.latex(factors[-1]) + r"\Big)\,\bar w_t \ \ (\sigma=-1,\ \text{ascent}),\qquad "
             r"\bar w_{t+1} = \Big(" + sp.latex(factors[1]) + r"\Big)\,\bar w_t \ \ (\sigma=+1,\ \text{penalty})"))

# %% [markdown]
# For the sharpness-raising sign and no weight decay the factor is $1 + 2\eta\alpha s_t$: every
# step multiplies the mean row by more than one, although the mean row never changes a
# probability. The penalty sign gives $1 - 2\eta\alpha s_t$, which shrinks it (and overshoots
# through zero if $2\eta\alpha s_t > 1$). The quotient objective leaves only the weight-decay
# factor $1 - \eta\lambda$ in both cases. We check the ascent factor on a trajectory: a linear
# softmax classifier on the 64 digit pixels (the features are frozen, $h = x$), full-batch
# SGD with `lossgeom.regularisers.train`, which records $\bar w_t$ and $s_t$ at every step.
# One run is $T_{\mathrm{on}}$ steps with the regulariser, then (used in the last section)
# $T_{\mathrm{off}}$ steps of cross-entropy alone, recording the test accuracy every 25 steps:

# %%
digit_split = digits(n_train=500, n_test=500, seed=0)
probe_model = tasks.LinearProbe(64, 10, seed=0)
probe_features = lambda params, x: x  # frozen features: h is the input itself (what LinearProbe returns)
probe_init = {k: v.detach().clone() for k, v in probe_model.named_parameters()}
ETA, CAP, T_ON, T_OFF = 0.5, 10.0, 150, 75
test_acc = lambda step, q: tasks.accuracy(probe_model, q, digit_split.x_test, digit_split.y_test)
common = dict(lr=ETA, centred_cap=CAP, record=test_acc, record_every=25)


def long_run(objective, alpha):
    mid, on = reg.train(probe_features, probe_init, digit_split.x_train, digit_split.y_train, objective=objective,
                        alpha=alpha, sign=-1, steps=T_ON, **common)
    out = {**on, "on": on["records"], "crn": on["mean_row"].norm(dim=1) * math.sqrt(10)}
    if on["diverged_at"] is None:
        _, off = reg.train(probe_features, mid, digit_split.x_train, digit_split.y_train, objective="ce", alpha=0.0,
                           steps=T_OFF, **common)
        out["off"] = off["records"]
    return out


# %% [markdown]
# We run it once with the raw proxy at $\alpha = 0.01$ and compare every step with the
# recursion:

# %%
runs = {("raw", 1e-2): long_run("raw", 1e-2)}
wbar, s_hist = runs[("raw", 1e-2)]["mean_row"], runs[("raw", 1e-2)]["s"]
predicted = (1 + 2 * ETA * 1e-2 * s_hist)[:, None] * wbar[:-1]
factor_error = float(((wbar[1:] - predicted).norm(dim=1) / wbar[1:].norm(dim=1)).max())
growth = float(wbar[-1].norm() / wbar[0].norm())
assert factor_error <= 1e-10 and growth > 10
print(f"{T_ON} ascent steps (eta = {fmt(ETA)}, alpha = 0.01): largest relative deviation from "
      f"wbar_(t+1) = (1 + 2 eta alpha s_t) wbar_t is below 1e-10; |wbar| grew by a factor {fmt(growth, 4)}")

# %% [markdown]
# The recursion holds at every step of the trajectory, to rounding. Here the centred part
# of $W$ is kept inside the ball $\lVert W_c\rVert_F \le 10$ (an argument of `train`, applied as a
# projection after each step that leaves $\bar w$ alone): without it the ascent also inflates
# $W_c$, the probabilities saturate, $s_t$ falls to zero and the factor returns to one. The
# cap plays the role of the source's "quotient cap that leaves the common-row component
# unconstrained".

# %%
ledger.add("S11", "Ascent on alpha*B_raw multiplies the mean row by (1 + 2 eta alpha s_t) per SGD step; penalty: (1 - 2 eta alpha s_t)",
           {"factor (sympy, with weight decay lambda)": str(factors[-1]), "penalty sign": str(factors[1]),
            "quotient": "1 - eta*lambda", "trajectory max rel. deviation": "< 1e-10", "|wbar| growth in 150 steps": growth})

# %% [markdown]
# ## Paired one-step tests on trained models
#
# Now the experiment of {cite:t}`opazo2026flatness` at CPU scale. We train four classifiers
# whose last layer is a bias-free $W$: the one-layer transformer on $(a + b) \bmod 23$, a ReLU
# MLP on $(a - b) \bmod 23$ (both from `lossgeom.tasks`, half the pairs for training), a ReLU
# MLP on the digit images trained end to end, and a linear probe on that MLP's frozen hidden
# features. Each is trained with full-batch AdamW and three checkpoints are kept along the
# way. `SCALE` selects the setting; `"source"` is the paper's count of ten checkpoints per
# family (and a larger modulus), which takes minutes rather than seconds:

# %%
SCALE = "small"
SETTINGS = {"small": dict(p=23, steps=90, every=30), "source": dict(p=97, steps=3000, every=300)}
cfg = SETTINGS[SCALE]
mod_add = tasks.modular_arithmetic(cfg["p"], "add", train_fraction=0.5, seed=0)
mod_sub = tasks.modular_arithmetic(cfg["p"], "subtract", train_fraction=0.5, seed=0)
models = {
    "transformer, a+b": (tasks.ModularTransformer(cfg["p"], d_model=32, n_heads=4, d_mlp=64, seed=0), mod_add, 1e-2, 1.0),
    "MLP, a-b": (tasks.MLPClassifier(None, (128,), cfg["p"], modulus=cfg["p"], seed=0), mod_sub, 1e-2, 1.0),
    "digits MLP, end to end": (tasks.MLPClassifier(64, (64,), 10, seed=0), digit_split, 1e-2, 0.1),
}
fits = {name: tasks.fit(m, data, cfg["steps"], lr=lr, weight_decay=wd, snapshot_every=cfg["every"])
        for name, (m, data, lr, wd) in models.items()}
for name, r in fits.items():
    print(f"{name}: {len(r.snapshots)} checkpoints; final train accuracy {fmt(r.train_accuracy, 3)}, test {fmt(r.test_accuracy, 3)}")
assert all(r.train_accuracy == 1.0 for r in fits.values())

# %% [markdown]
# All three fit their training sets; the modular models have not generalised after so few
# steps, which does not matter here, since the test asks only whether two names of one trained
# predictor move alike. The frozen-feature family trains a probe on the digit MLP's hidden
# features:

# %%
digit_mlp = models["digits MLP, end to end"][0]
hidden = lambda x: tasks.features(digit_mlp, dict(digit_mlp.named_parameters()), x).detach()
frozen = Split(hidden(digit_split.x_train), digit_split.y_train, hidden(digit_split.x_test), digit_split.y_test,
               "hidden features of the trained digits MLP")
probe = tasks.LinearProbe(64, 10, seed=1)
fits["digits, frozen features"] = tasks.fit(probe, frozen, cfg["steps"], lr=1e-2, weight_decay=0.1, snapshot_every=cfg["every"])
models["digits, frozen features"] = (probe, frozen, 1e-2, 0.1)
print(f"frozen-feature probe: test accuracy {fmt(fits['digits, frozen features'].test_accuracy, 3)}")


# %% [markdown]
# For each checkpoint we centre $W$ (itself a function-preserving move) and build shifted
# twins $W_c + \mathbf 1 v^\top$ with `shift_for_ratio`, which sizes $v$ so that
# $B_{\mathrm{raw}}$ becomes exactly 10 or 100 times its centred value; two random
# directions per ratio give four pairs per checkpoint. Before any step we assert that
# probabilities, $B_{\mathrm{quot}}$ and $\kappa_{\mathrm{exact}}$ are unchanged and that the
# raw proxy has the intended ratio:

# %%
def make_pairs(name, step, params, n_dirs=2, ratios=(10.0, 100.0)):
    model, data = models[name][0], models[name][1]
    feats = functools.partial(tasks.features, model)
    centred = dict(params)
    centred[W_NAME] = softmax.centre(params[W_NAME])
    with torch.no_grad():
        h = feats(centred, data.x_train)
        base = {k: float(f(centred[W_NAME], h)) for k, f in (("raw", softmax.b_raw), ("quot", softmax.b_quot), ("exact", softmax.kappa_exact))}
        assert abs(base["raw"] / base["quot"] - 1) <= 1e-12  # the centred point is the 1x member
        g = torch.Generator().manual_seed(1000 * step + len(name))
        pairs = []
        for ratio in ratios:
            for _ in range(n_dirs):
                v = reg.shift_for_ratio(centred[W_NAME], ratio, torch.randn(h.shape[1], generator=g))
                W_twin = softmax.common_row_shift(centred[W_NAME], v)
                assert abs(float(softmax.b_raw(W_twin, h)) / base["raw"] - ratio) <= 1e-9 * ratio
                assert abs(float(softmax.b_quot(W_twin, h)) / base["quot"] - 1) <= 1e-12
                assert abs(float(softmax.kappa_exact(W_twin, h)) / base["exact"] - 1) <= 1e-10
                assert float((softmax.probabilities(W_twin, h) - softmax.probabilities(centred[W_NAME], h)).abs().max()) <= 1e-12
                pairs.append((ratio, softmax.row_shift_symmetry(v, W_NAME)))
    ce = float(torch.nn.functional.cross_entropy(h @ centred[W_NAME].T, data.y_train))
    return feats, centred, pairs, 0.1 * ce / base["quot"]


# %% [markdown]
# The coefficient $\alpha$ is calibrated once per checkpoint at the centred model, so that
# $\alpha B_{\mathrm{quot}}$ is a tenth of the cross-entropy there, and reused unchanged at
# the twin. Every pair then takes one plain SGD step ($\eta = 0.1$, fresh optimiser state,
# the full training set) on each of the four objectives through `paired_steps`, which first
# audits the pair with `audit_symmetry` on the test inputs' probabilities (tolerance
# $10^{-10}$) and reports the largest probability difference after the step:

# %%
OBJECTIVES = ("raw", "quot", "exact", "ce")
results = []
for name, r in fits.items():
    data = models[name][1]
    for step, params in r.snapshots:
        feats, centred, pairs, alpha_cal = make_pairs(name, step, params)
        rows = [{"family": name, "ratio": ratio} for ratio, _ in pairs]
        steps = reg.paired_steps(feats, centred, [sym for _, sym in pairs], data.x_train, data.y_train,
                                 data.x_test, objective=OBJECTIVES, alpha=alpha_cal, lr=0.1, tol=1e-10)
        for k, res in enumerate(steps):
            row = rows[k % len(rows)]
            row[res.objective], row[res.objective + "_disagree"], row["before"] = res.gap_after, res.disagreement, res.gap_before
        results.extend(rows)
print(f"{len(results)} pairs, {len(results) * len(OBJECTIVES)} paired steps")

# %% [markdown]
# One table per family summarises the pairs: the largest probability gap before the step,
# the smallest and largest gap after a raw-regularised step, the largest gaps after the
# quotient, exact and plain cross-entropy steps (printed against the asserted bound), and
# the largest fraction of test predictions on which a raw-regularised pair disagrees:

# %%
QUOT_TOL = 1e-12
summary = {}
for name in fits:
    rows = [r for r in results if r["family"] == name]
    s = {k: max(r[k] for r in rows) for k in ("before", "raw", "quot", "exact", "ce", "raw_disagree")}
    s["raw_min"], s["pairs"] = min(r["raw"] for r in rows), len(rows)
    s["raw_min_100x"] = min(r["raw"] for r in rows if r["ratio"] == 100.0)
    assert s["before"] <= 1e-10 and max(s["quot"], s["exact"], s["ce"]) <= QUOT_TOL
    assert s["raw_min"] >= 1e3 * QUOT_TOL
    summary[name] = s
    print(f"{name}: {s['pairs']} pairs | before <= 1e-10 | raw after: {fmt(s['raw_min'], 3)} to {fmt(s['raw'], 3)} "
          f"(prediction disagreement up to {fmt(s['raw_disagree'], 3)}) | quot, exact, CE after: all <= {fmt(QUOT_TOL)}")
n_pairs = len(results)
max_raw = max(s["raw"] for s in summary.values())
glue("ch09-npairs", n_pairs, display=False)
glue("ch09-maxraw", max_raw, display=False)
glue("ch09-minraw", min(s["raw_min"] for s in summary.values()), display=False)

# %% [markdown]
# In all {glue:text}`ch09-npairs` pairs the raw-regularised step separates the two
# representatives, by between {glue:text}`ch09-minraw:.3g` and {glue:text}`ch09-maxraw:.3g` in
# some class probability, while the quotient, exact and cross-entropy steps keep every pair
# within $10^{-12}$. The figure shows all pairs; gaps at the level of rounding are drawn at
# their measured value:

# %%
pair_contract = MeasurementContract(
    centre="the row-centred checkpoint W_c and its twin W_c + 1 v^T (3 checkpoints per family)",
    directions="v along 2 seeded Gaussian directions per ratio", normalisation="|v| set so B_raw(twin) = 10 or 100 x B_raw(W_c)",
    radius="one SGD step, eta = 0.1, fresh optimiser state", loss="CE + alpha S, S in {B_raw, B_quot, kappa_exact, 0}; alpha B_quot = CE/10 at W_c",
    reduction="mean over the full training set", data="modular a+b and a-b (p = 23, half the pairs), sklearn digits (500 train)",
    model_mode="n/a (no dropout or batch norm)", resolution=f"{n_pairs} pairs; gap = max |p - p'| over the test inputs", precision="float64",
)
fig, ax = plt.subplots(figsize=(7.0, 3.8))
for j, name in enumerate(fits):
    rows = [r for r in results if r["family"] == name]
    for k, obj in enumerate(OBJECTIVES):
        vals = np.maximum([r[obj] for r in rows], 1e-17)
        ax.scatter(np.full(len(vals), j + (k - 1.5) * 0.18), vals, s=10, color=f"C{k}", label=obj if j == 0 else None)
ax.axhline(QUOT_TOL, color="grey", ls="--", lw=0.8)
ax.set_yscale("log")
ax.set_xticks(range(len(fits)), list(fits), fontsize=8)
ax.set_ylabel("max |p - p'| after one step")
ax.legend(ncol=4, fontsize=8)
glue_figure("ch09-pairs", fig, pair_contract,
    "Largest probability difference between two representatives of one predictor after one matched step; dashed: 1e-12")

# %% [markdown]
# ```{glue:figure} fig-ch09-pairs
# :name: fig-ch09-pairs
#
# {glue:text}`cap-ch09-pairs`
# ```
#
# {numref}`fig-ch09-pairs` separates the objectives cleanly: the smallest raw gap,
# {glue:text}`ch09-minraw:.3g`, lies orders of magnitude above every quotient, exact and
# cross-entropy gap. The raw proxy is not a function of the predictor; the quotient and
# exact proxies are. The raw gap grows with the shift ratio and varies a lot between
# families and checkpoints, because it scales with $\eta\alpha\Delta_v$ and with how far the
# predictions are from uniform.
#
# The size of the raw separation is therefore a matter of the step, which the source
# leaves to the experiment. We vary the calibration, $\alpha B_{\mathrm{quot}} = f\cdot\mathrm{CE}$
# at the centred model for $f \in \{0.01, 0.1, 1\}$, on the last checkpoint of each family
# with one 100x shift:

# %%
FRACTIONS = (0.01, 0.1, 1.0)
sweep = {}
for name, r in fits.items():
    step, params = r.snapshots[-1]
    feats, centred, pairs, alpha_cal = make_pairs(name, step, params, n_dirs=1, ratios=(100.0,))
    data = models[name][1]
    for frac in FRACTIONS:
        raw_res, quot_res = reg.paired_steps(feats, centred, [pairs[0][1]], data.x_train, data.y_train, data.x_test,
                                             objective=("raw", "quot"), alpha=alpha_cal * frac / 0.1, lr=0.1)
        assert quot_res.gap_after <= QUOT_TOL
        sweep[(name, frac)] = raw_res.gap_after
    print(f"{name}: raw gap after one step at f = " + ", ".join(f"{fmt(f_)}: {fmt(sweep[(name, f_)], 3)}" for f_ in FRACTIONS)
          + f" | quotient gap <= {fmt(QUOT_TOL)} at every f")
assert all(sweep[(n, 0.01)] < sweep[(n, 1.0)] for n in fits)

# %% [markdown]
# The raw gap grows with $\alpha$ in every family, roughly in proportion while it is small
# and saturating near 1 for the transformer, while the quotient gap stays at rounding level
# at every calibration: whether the raw separation looks small or large depends on the
# step, whether it is there at all does not.

# %%
ledger.add("S12", "Paired one-step tests: raw separates equivalent models, quotient/exact/CE keep them aligned",
           {"pairs": n_pairs, "families": len(fits), "largest raw difference": max_raw,
            "smallest raw difference": min(s["raw_min"] for s in summary.values()),
            "largest quotient/exact/CE difference": f"<= {QUOT_TOL:g}",
            **{f"{k}: largest raw difference": s["raw"] for k, s in summary.items()},
            "raw gap vs f (transformer, 100x)": [sweep[("transformer, a+b", f_)] for f_ in FRACTIONS]},
           reported="45 pairs; quotient differences below 1e-12", status="holds at our scale",
           note="3 checkpoints per family from short runs (modular models not generalised), SGD step eta=0.1, alpha calibrated to CE/10")

# %% [markdown]
# ## Raising sharpness over a long horizon
#
# The last question is what the intervention does to a training run. We train the pixel
# probe from its initialisation for $T_{\mathrm{on}} = 150$ steps on $\mathrm{CE} - \alpha S$ (the
# sharpness-raising sign), then remove the regulariser and train $T_{\mathrm{off}} = 75$ more
# steps on cross-entropy alone, with the same cap $\lVert W_c\rVert_F \le 10$ throughout, for the
# raw and the quotient proxy and a sweep of $\alpha$, beside a cross-entropy control
# (`long_run` from the runaway section; the raw run at $\alpha = 0.01$ is the one checked there):

# %%
ALPHAS = (1e-3, 1e-2, 1e-1)
runs[("ce", 0.0)] = long_run("ce", 0.0)
runs.update({(obj, a): long_run(obj, a) for obj in ("raw", "quot") for a in ALPHAS if (obj, a) not in runs})
runs = {key: runs[key] for key in [("ce", 0.0)] + [(o, a) for o in ("raw", "quot") for a in ALPHAS]}

# %% [markdown]
# For each run the table gives the test accuracy at the end of the regularised phase and
# after removal, and the largest common-row norm $\lVert \mathbf 1\bar w^\top\rVert_F = \sqrt K\lVert\bar w\rVert$
# reached while the regulariser was on:

# %%
control_on, control_off = runs[("ce", 0.0)]["on"][-1], runs[("ce", 0.0)]["off"][-1]
lines, s13 = [], {}
for (obj, a), run in runs.items():
    finite = run["crn"][torch.isfinite(run["crn"])]
    crn_max = float(finite.max())
    if run["diverged_at"] is not None:
        lines.append(f"{obj:5s} alpha={fmt(a, 2):6s}: overflowed at step {run['diverged_at']} (largest finite common-row norm {fmt(crn_max, 3)})")
    else:
        lines.append(f"{obj:5s} alpha={fmt(a, 2):6s}: test acc on {fmt(run['on'][-1], 3)}, after removal {fmt(run['off'][-1], 3)}, "
                     f"max common-row norm {fmt(crn_max, 4)}")
    s13[(obj, a)] = dict(crn=crn_max, on=run["on"][-1], off=run.get("off", [float("nan")])[-1], diverged=run["diverged_at"])
print("\n".join(lines))

# %%
raw_runaway = [a for a in ALPHAS if s13[("raw", a)]["crn"] > 1e3 or s13[("raw", a)]["diverged"] is not None]
assert all(abs(s13[("quot", a)]["crn"] / s13[("ce", 0.0)]["crn"] - 1) <= 1e-6 for a in ALPHAS)
suppressed = [(o, a) for (o, a), v in s13.items() if o != "ce" and v["diverged"] is None and v["on"] <= control_on - 0.2]
recovered = [(o, a) for (o, a) in suppressed if s13[(o, a)]["off"] >= control_off - 0.05]
assert raw_runaway and suppressed and recovered == suppressed
assert s13[("raw", max(ALPHAS))]["diverged"] is not None
assert all(abs(s13[(o, min(ALPHAS))]["on"] - control_on) <= 0.05 for o in ("raw", "quot"))
print(f"control: {fmt(control_on, 3)} -> {fmt(control_off, 3)}; suppressed by >= 0.2: {suppressed}; "
      f"recovered to within 0.05 of the control after removal: {recovered}; raw runaway past 1e3 at alpha in {raw_runaway}")

# %% [markdown]
# Raising sharpness suppresses test accuracy and removing the regulariser restores it, for
# both proxies once $\alpha$ is large enough; the smallest $\alpha$ stays within five points
# of the control in 150 steps. Only the raw proxy moves the common row: under the quotient its norm stays at its
# initial value, while under the raw proxy it grows geometrically, and at the largest $\alpha$
# it passes $10^3$ and keeps going until the logits overflow float64, so that run has no
# recovery phase. The figure shows both:

# %%
long_contract = pair_contract.with_(
    centre="seeded initialisation of a linear softmax probe on the 64 pixels", directions="full-batch SGD trajectory",
    normalisation=f"centred part projected onto |W_c|_F <= {fmt(CAP)} after each step", radius=f"{T_ON} steps with the regulariser, {T_OFF} without, eta = {fmt(ETA)}",
    loss="CE - alpha S (sharpness-raising), then CE", data="sklearn digits, 500 train / 500 test",
    resolution="test accuracy every 25 steps; common-row norm every step",
)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8.6, 3.4), layout="constrained")
for k, ((obj, a), run) in enumerate(runs.items()):
    acc = run["on"] + run.get("off", [])[1:]
    style = "-" if obj == "raw" else ("--" if obj == "quot" else ":")
    ax1.plot(np.arange(len(acc)) * 25, acc, style, color=f"C{k}", label=f"{obj} {fmt(a, 2)}" if obj != "ce" else "CE")
    ax2.semilogy(run["crn"].numpy(), style, color=f"C{k}")
ax1.axvline(T_ON, color="grey", lw=0.8)
ax1.set_xlabel("step (regulariser removed at the line)")
ax1.set_ylabel("test accuracy")
ax1.legend(fontsize=7)
ax2.axhline(1e3, color="grey", lw=0.8, ls="--")
ax2.set_ylim(0.1, 1e8)  # the alpha = 0.1 raw run leaves the axis upwards and overflows
ax2.set_xlabel("step (regulariser on)")
ax2.set_ylabel(r"common-row norm $\sqrt{K}\,\|\bar w\|$")
glue_figure("ch09-long", fig, long_contract,
    "Left: test accuracy with the sharpness-raising regulariser on, then removed. Right: the function-null common-row norm "
    "(axis clipped at 1e8; dashed: 1e3)")

# %% [markdown]
# ```{glue:figure} fig-ch09-long
# :name: fig-ch09-long
#
# {glue:text}`cap-ch09-long`
# ```
#
# In {numref}`fig-ch09-long` the raw and quotient runs share the accuracy story but not the
# gauge story: the suppression comes from raising sharpness at all, the runaway from the raw
# proxy's dependence on the coordinate that no prediction sees.

# %%
ledger.add("S13", "Long horizon, small scale: sharpness-raising suppresses accuracy, removal recovers; raw common-row norm runs away",
           {"control test acc (on, off)": [control_on, control_off],
            **{f"{o} alpha={a:g}": ("overflow at step %d" % v["diverged"]) if v["diverged"] is not None
               else {"acc on": v["on"], "acc off": v["off"], "max common-row norm": v["crn"]} for (o, a), v in s13.items() if o != "ce"}},
           reported="CIFAR-10: suppression 10.61 points, recovery 11.90 points; common-row norm exceeds 1e3",
           status="holds at our scale",
           note=f"linear probe on digit pixels, {T_ON}+{T_OFF} SGD steps, centred part capped at {fmt(CAP)}; the quotient suppresses too, "
                "so suppression is not specific to the raw proxy")

# %% [markdown]
# ## What this establishes
#
# A regulariser acts on the function through its velocity {eq}`eq-ch09-velocity`, and that
# velocity is a property of the predictor only if it is the same at every parameter point
# that implements it. The raw bound fails this test exactly: its velocity gap is
# $-2\Delta_v\lVert h\rVert^4P(p)^2p$, no scalar retuning closes it, and as an intervention it
# feeds a coordinate that no prediction sees. Centring the classifier removes all three
# defects for the softmax common-row symmetry, and only for it: the quotient bound is still
# a loose upper bound on $\kappa_{\mathrm{exact}}$, and raising it still suppresses accuracy.
# The long-horizon runs here are a linear probe on digits, far from the source's CIFAR-10
# ResNets, so they show the mechanism rather than its size.
#
# ## Results ledger

# %%
ledger
