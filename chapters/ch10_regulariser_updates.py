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
# Why would anyone run gradient *ascent* on a flatness measure? To test whether flatness is
# necessary for generalisation. {cite:t}`han2025flatness` intervene during grokking
# {cite}`power2022grokking`, where a network first memorises its training set and only much
# later generalises: a regulariser that keeps the solution sharp should, if flatness is
# necessary, delay or suppress generalisation, and removing it should let generalisation
# return. The flatness measure is relative flatness {cite}`petzka2021relative`, whose
# last-layer contraction is $\kappa_{\mathrm{exact}}$; what is differentiated in practice is
# its tractable trace upper bound $B_{\mathrm{raw}}$ of {numref}`Chapter %s <ch-softmax-gauge>`,
# the same bound that {cite:t}`walter2026flatness` invert into the certificate of the
# previous chapter. The centred bound $B_{\mathrm{quot}}$ is the repair proposed by
# {cite:t}`opazo2026flatness`, whose analysis this chapter follows.
#
# Such an intervention says something about the predictor only if it acts on the predictor:
# two parameter points that implement the same predictor must be moved in the same way. We
# derive in closed form how $B_{\mathrm{raw}}$ moves the class probabilities of two equivalent
# classifiers, show that no rescaling of the regulariser aligns them, derive the runaway of
# the function-null mean row under the sharpness-raising sign, and then run paired one-step
# tests and long runs on small models trained here: one-layer transformers on modular
# addition and multiplication, an MLP on modular subtraction, and digit classifiers.
#
# ```{admonition} Key ideas
# :class: tip
# - A regulariser acts on the predictor through its *functional velocity*, so it tests
#   something about the predictor only if it moves every parameter point that implements the
#   predictor in the same way.
# - The raw bound $B_{\mathrm{raw}}$ fails this: its velocity differs between equivalent
#   classifiers by an exact amount, and no rescaling of its coefficient aligns them.
# - Used to raise sharpness, $B_{\mathrm{raw}}$ multiplies a coordinate that no prediction sees,
#   the classifier's mean row, by more than one at every step: a runaway.
# - The centred bound $B_{\mathrm{quot}}$ and $\kappa_{\mathrm{exact}}$ move equivalent models
#   alike, on small trained transformers, MLPs and digit classifiers as in the derivation.
# ```
#
# **Claims established here:** S10, S11, S12, S13.
#
# We load the tools once. Torch runs on one thread, so every reduction happens in one order:

# %% tags=["remove-cell"]
# Only on Google Colab: install the book's package and what the chapter imports.
import subprocess, sys
if "google.colab" in sys.modules:
    book = "lossgeom[book] @ git+https://github.com/lossgeom/same-function-different-geometry@main"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", book], check=True)

# %% tags=["hide-cell"]
from lossgeom_book.setup import setup

ledger = setup("a regulariser must move equivalent models alike", single_thread=True)

# %% tags=["hide-input"]
import math

import numpy as np
import sympy as sp
import torch
import matplotlib.pyplot as plt
from IPython.display import Math, display

from lossgeom import flatness
from lossgeom.contract import MeasurementContract
from lossgeom.flatness import softmax_gauge as softmax
from lossgeom.formatting import fmt, rounding_level
from lossgeom.models import accuracy
from lossgeom_book import regulariser_checks, tasks
from lossgeom_book import regularisers as reg
from lossgeom_book.data import digits, Split
from lossgeom_book.display import glue_figure, glue_value

W_NAME = tasks.CLASSIFIER

# %% [markdown]
# ## Three requirements
#
# For a classifier $W \in \mathbb R^{K\times d}$ on features $h$, with $p = \operatorname{softmax}(Wh)$
# and $P(p) = \operatorname{Diag}(p) - pp^\top$, write $s(W, h) = \lVert h\rVert^2 (1 - \lVert p\rVert^2)$,
# so that $B_{\mathrm{raw}} = \lVert W\rVert_F^2\, s$ and $B_{\mathrm{quot}} = \lVert W_c\rVert_F^2\, s$ with
# $W_c$ the row-centred classifier. The common-row shift $W \mapsto G_v(W) = W + \mathbf 1 v^\top$
# leaves $p$, $s$, $B_{\mathrm{quot}}$ and $\kappa_{\mathrm{exact}}$ unchanged and changes
# $\lVert W\rVert_F^2$ by $\Delta_v = \lVert W + \mathbf 1 v^\top\rVert_F^2 - \lVert W\rVert_F^2$.
#
# Let $F(\theta)$ be the model's class probabilities on a fixed probe set and $S(\theta)$ a
# score added to the loss. Gradient descent on $S$ with step $\eta$ moves the outputs by
# $-\eta\,\mathcal V_S + O(\eta^2)$, where
#
# $$
# \mathcal V_S(\theta) = J_F(\theta)\, \nabla_\theta S(\theta)
# $$ (eq-ch10-velocity)
#
# is the *functional velocity* of $S$. {cite:t}`opazo2026flatness` ask three separate things
# of a score:
#
# 1. **approximation validity**: used as an upper-bound proxy, is $\kappa_{\mathrm{exact}} \le S$?
# 2. **value identification**: do equivalent parameters get the same score, $S(G_v(W), h) = S(W, h)$?
# 3. **interventional identification**: is the velocity {eq}`eq-ch10-velocity` the same along
#    each orbit of $G_v$, so that a regulariser moves equivalent models alike?
#
# `lossgeom_book.regulariser_checks.identification_checklist` measures all three on one classifier and
# its shifted twin; `functional_velocity` computes $\mathcal V_S$ without forming $J_F$
# (`torch.func.grad` gives $\nabla_\theta S$, one forward-mode product `torch.func.jvp`
# pushes it through $F$). A random 10-class classifier on 20 features, shifted by a random $v$:

# %%
g = torch.Generator().manual_seed(0)
W_check, h_check = torch.randn(10, 6, generator=g), torch.randn(20, 6, generator=g)
v_check = 3 * torch.randn(6, generator=g)
checklist = regulariser_checks.identification_checklist(W_check, h_check, v_check)

# %% [markdown]
# `checklist_report` says for each score whether each requirement is met: validity when the
# slack is not negative, an identification requirement when its relative gap is below
# $10^{-12}$ (then reported by its order, as rounding):

# %%
print(regulariser_checks.checklist_report(checklist, floor=1e-12))

# %% [markdown]
# All three proxies are valid upper bounds (the exact contraction trivially, with zero slack
# up to rounding). Only $B_{\mathrm{quot}}$ and $\kappa_{\mathrm{exact}}$ are identified; the raw
# proxy fails both identification requirements, by a relative amount of order one. The rest
# of the chapter explains the third failure, measures it on trained models and follows it
# over long runs.
#
# ## The raw proxy moves equivalent models apart
#
# Three facts carry the derivation. Sympy checks the first two exactly for $K = 3$: the
# softmax Jacobian is $P(p)$, and a common shift of the logits leaves $p$ unchanged. An
# expression counts as zero when expanding it, merging the exponentials and cancelling the
# resulting rational function leaves exactly 0:

# %%
K = 3
is_identically_zero = lambda M: all(sp.cancel(sp.powsimp(sp.expand(e))) == 0 for e in M)
softmax_of = lambda logits: logits.applyfunc(sp.exp) / sum(logits.applyfunc(sp.exp))
z, c_shift = sp.Matrix(sp.symbols("z1:4", real=True)), sp.symbols("c", real=True)
p_z = softmax_of(z)

# %%
P_z = sp.diag(*p_z) - p_z * p_z.T
assert is_identically_zero(p_z.jacobian(z) - P_z)
assert is_identically_zero(softmax_of(z + c_shift * sp.ones(K, 1)) - p_z)

# %% [markdown]
# Both hold for every $z$. The third fact is the chain rule through $z = Wh$: a change
# $\delta W$ moves the logits by $\delta W\, h$, so the probability Jacobian in $W$ acts as
# $J_{p,W}[\delta W] = P(p)\,\delta W\, h$. With $\partial s/\partial z = -2\lVert h\rVert^2 P(p)p$,
# which sympy confirms,

# %%
h_sym = sp.Matrix(sp.symbols("h1:3", real=True))
h_norm2 = (h_sym.T * h_sym)[0]
s_z = h_norm2 * (1 - (p_z.T * p_z)[0])
assert is_identically_zero(sp.Matrix([s_z.diff(zi) for zi in z]) + 2 * h_norm2 * P_z * p_z)

# %% [markdown]
# this gives $\nabla_W s = -2\lVert h\rVert^2 P(p) p\, h^\top$, and the product rule gives
# $\nabla_W B_{\mathrm{raw}} = 2sW + \lVert W\rVert_F^2 \nabla_W s$. At $W + \mathbf 1v^\top$ the
# first term gains $2s\mathbf 1v^\top$ and the second is scaled by $\lVert W\rVert_F^2 + \Delta_v$.
# Sympy pushes the difference through $J_{p,W}$ on symbols $p$, $h$, $v$. First the
# probabilities, held on the simplex, and their covariance $P(p)$:

# %%
p_sym = sp.Matrix(sp.symbols("p1:4", positive=True))
on_simplex = {p_sym[2]: 1 - p_sym[0] - p_sym[1]}
P = sp.diag(*p_sym) - p_sym * p_sym.T

# %% [markdown]
# then the shift $v$, the scalars $s$ and $\Delta_v$, and $\nabla_W s$:

# %%
v_sym = sp.Matrix(sp.symbols("v1:3", real=True))
s_sym, delta_v = sp.symbols("s Delta_v", real=True)
grad_s = -2 * h_norm2 * P * p_sym * h_sym.T

# %% [markdown]
# The difference of the two gradients, pushed through $J_{p,W}$, against the claimed form:

# %%
# grad B_raw(W + 1 v^T) - grad B_raw(W):
grad_gap = 2 * s_sym * sp.ones(K, 1) * v_sym.T + delta_v * grad_s
pushed_gap = (P * grad_gap * h_sym).subs(on_simplex)
claimed = (-2 * delta_v * h_norm2**2 * P * P * p_sym).subs(on_simplex)
assert sp.expand(pushed_gap - claimed) == sp.zeros(K, 1)


# %% [markdown]
# $$
# J_{p,W}\big(\nabla_W B_{\mathrm{raw}}(W + \mathbf 1 v^\top) - \nabla_W B_{\mathrm{raw}}(W)\big)
# = -2\,\Delta_v\, \lVert h\rVert^4\, P(p)^2 p .
# $$ (eq-ch10-gap)
#
# The function-null term $2s\mathbf 1 v^\top$ drops out because $P(p)\mathbf 1 = 0$ once the
# probabilities sum to one; what remains vanishes only if $\Delta_v = 0$ or $P(p)p = 0$, that
# is $p$ uniform. In torch, {eq}`eq-ch10-gap` reads

# %%
def gap_formula(W, h, v):
    """-2 Delta_v ||h||^4 P(p)^2 p, the closed form of the raw velocity gap."""
    p = softmax.probabilities(W, h)
    P, delta = softmax.covariance(p), (softmax.common_row_shift(W, v) ** 2).sum() - (W**2).sum()
    return -2 * delta * (h @ h) ** 2 * P @ P @ p


# %% [markdown]
# and we check it with autograd at random classifiers ($K = 3$ and $K = 10$): `velocity_gap`
# computes both velocities with `functional_velocity` and subtracts them.

# %%
def raw_velocity_gap(K, d, seed):
    """Relative deviation of the autograd velocity gap of B_raw from the closed form; its size."""
    g = torch.Generator().manual_seed(seed)
    W, h = torch.randn(K, d, generator=g), torch.randn(d, generator=g)
    v = 2 * torch.randn(d, generator=g)
    gap, formula = regulariser_checks.velocity_gap(flatness.b_raw, W, h, v), gap_formula(W, h, v)
    return float((gap - formula).abs().max() / formula.abs().max()), float(formula.abs().max())


# %% [markdown]
# Three seeds at each size, and the closed form's size, to see that the gap is not small:

# %%
checks = [raw_velocity_gap(K_, d_, seed) for K_, d_ in ((3, 4), (10, 6)) for seed in range(3)]
worst_rel, gap_sizes = max(c[0] for c in checks), [c[1] for c in checks]
assert min(gap_sizes) > 1e-6
print(f"6 random (W, h, v), K in {{3, 10}}: relative deviation of the autograd velocity gap from "
      f"the closed form {rounding_level(worst_rel, 1e-10)}; gap sizes "
      f"{fmt(min(gap_sizes), 3)} to {fmt(max(gap_sizes), 3)}")


# %% [markdown]
# Autograd and the closed form agree, and the velocity gap is far from zero at every
# sampled point: two names for one predictor are pushed in different functional directions.
#
# ## No rescaling of the regulariser aligns the updates
#
# Could a per-model choice of the coefficient $\alpha$ repair this? The seed's Corollary 3
# answers in general. Let $F(\theta)$ be any differentiable model output with
# $\theta = (W, \xi)$ and the common-row symmetry, $a(\theta)$ any differentiable
# gauge-invariant function, $S(\theta) = a(\theta)\lVert W\rVert_F^2$ and
# $c = \lVert W\rVert_F^2$. Along one orbit
#
# $$
# \mathcal V_S = A + c\,B, \qquad A = 2a\, J_{F,W}\operatorname{vec}(W),\quad B = J_F\nabla_\theta a,
# $$ (eq-ch10-split)
#
# with $A$ and $B$ the same at every representative ($J_{F,W}$ annihilates $\mathbf 1v^\top$).
# If $A$ and $B$ are linearly independent, $\lambda_1 (A + c_1 B) = \lambda_2 (A + c_2 B)$ gives
# $(\lambda_1 - \lambda_2)A + (\lambda_1c_1 - \lambda_2c_2)B = 0$, so $\lambda_1 = \lambda_2$ and then
# $c_1 = c_2$: no nonzero scalars align two representatives with different norms. For
# $S = B_{\mathrm{raw}}$, $F = p$ and one fixed feature, $J_{p,W}\operatorname{vec}(W) = P(p)Wh = P(p)\log p$
# (the logits are $\log p$ up to a common constant, which $P$ removes) and
# $B = -2\lVert h\rVert^4 P(p)^2 p$, so independence is decided by the $K \times 2$ matrix
# $[P(p)\log p,\ P(p)^2p]$. We write each logarithm of a rational number in the prime basis
# $\log 2, \log 3, \log 5, \dots$; since logarithms of distinct primes are linearly independent
# over the rationals, an expanded expression in that basis is zero only if every coefficient is:

# %%
def log_in_prime_basis(q):
    """log of a positive rational as an exact sum of integer multiples of log(prime)."""
    q = sp.Rational(q)
    numerator, denominator = sp.factorint(q.p).items(), sp.factorint(q.q).items()
    return sum(e * sp.log(b) for b, e in numerator) - sum(e * sp.log(b) for b, e in denominator)


# %%
def exact_velocity_minor(p_vec, log=sp.log):
    """First-two-rows minor of [P(p) log p, P(p)^2 p]: nonzero means A and B are independent."""
    p_vec = sp.Matrix(p_vec)
    P_mat = sp.diag(*p_vec) - p_vec * p_vec.T
    A_vec, B_vec = P_mat * p_vec.applyfunc(log), P_mat * P_mat * p_vec
    return sp.expand(A_vec[0] * B_vec[1] - A_vec[1] * B_vec[0])


# %% [markdown]
# For $K = 3$ at $p = (1/2, 3/10, 1/5)$:

# %%
p_star = [sp.Rational(1, 2), sp.Rational(3, 10), sp.Rational(1, 5)]
minor_star = exact_velocity_minor(p_star, log=log_in_prime_basis)
reported_minor = sp.Rational(9, 25000) * log_in_prime_basis(sp.Rational(640, 6561))
assert sp.expand(minor_star - reported_minor) == 0 and minor_star != 0

# %% [markdown]
# In the prime basis, beside the reported form and its value:

# %%
display(Math(r"\begin{aligned}M(\tfrac12, \tfrac{3}{10}, \tfrac15) &= " + sp.latex(minor_star)
             + r"\\ &= \tfrac{9}{25000}\log\tfrac{640}{6561}"
             + r" \approx " + sp.latex(sp.N(minor_star, 6)) + r"\end{aligned}"))

# %% tags=["remove-cell"]
glue_value("ch10-minor", float(minor_star), 6)


# %% [markdown]
# The minor equals the reported $\tfrac{9}{25000}\log(640/6561)$ exactly (the nonzero factors
# $2s$ and $-2\lVert h\rVert^4$ only rescale it), and it is {glue:text}`ch10-minor`, not zero.
# The minor is analytic on the open simplex, so its zero set has measure zero once it is
# nonzero somewhere. For $K > 3$ the seed's argument assigns a small positive mass to each
# extra class, which perturbs the first two rows only slightly, so a nonzero minor stays
# nonzero. Sympy checks it exactly for $K = 4, 5, 6$, giving each extra class mass $1/1000$:

# %%
def padded(K, mass=sp.Rational(1, 1000)):
    """p_star rescaled to leave mass 1/1000 for each of K - 3 extra classes."""
    return [q * (1 - (K - 3) * mass) for q in p_star] + [mass] * (K - 3)


# %% [markdown]
# The three minors, each asserted nonzero:

# %%
minors = {K_: exact_velocity_minor(padded(K_), log=log_in_prime_basis) for K_ in (4, 5, 6)}
assert all(m != 0 for m in minors.values())
print(", ".join(f"K = {K_}: M = {fmt(float(m), 4)}" for K_, m in minors.items()))

# %% [markdown]
# Each minor is a nonzero rational combination of logarithms of primes, hence nonzero, with
# the sign and size of the $K = 3$ value. A random sample of the $K = 3$ simplex finds no zero
# (`velocity_minor` is the same minor in floating point), and the uniform point shows that
# zeros do exist:

# %%
p_random = np.random.default_rng(9).dirichlet(np.ones(3), size=20000)
minor_random = np.abs(regulariser_checks.velocity_minor(p_random))
assert exact_velocity_minor([sp.Rational(1, 3)] * 3) == 0 and np.all(minor_random > 0)
print(f"20000 Dirichlet(1,1,1) draws: the minor is nonzero at every one; median |M| = "
      f"{fmt(np.median(minor_random), 3)}; at p uniform M = 0 exactly")

# %% [markdown]
# Finally, we watch the decomposition {eq}`eq-ch10-split` happen in autograd on one fixed
# feature with $K = 10$: three representatives with $c = \lVert W\rVert_F^2$ equal to 1, 10 and
# 100 times the centred value have velocities on one line $A + cB$, and the angle between
# any two of them is not zero, so no pair of scalars maps one onto the other:

# %%
g = torch.Generator().manual_seed(1)
W10 = softmax.centre(torch.randn(10, 6, generator=g))
h10, direction = torch.randn(2, 6, generator=g)
reps = {r: reg.twin_at_ratio(W10, r, direction) for r in (1.0, 10.0, 100.0)}
norms = {r: float((Wr**2).sum()) for r, Wr in reps.items()}

# %% [markdown]
# `twin_at_ratio` adds the common row $\mathbf 1v^\top$ along `direction` that makes
# $\lVert W\rVert_F^2$ the given multiple of the centred value. The velocities of the three:

# %%
F10 = lambda q: softmax.probabilities(q["W"], h10)
score10 = lambda q: flatness.b_raw(q["W"], h10)
vel = {r: reg.functional_velocity(F10, score10, {"W": Wr}) for r, Wr in reps.items()}

# %% [markdown]
# Two of them fix $A$ and $B$, and the third must then lie on the line $A + cB$:

# %%
B_dir = (vel[100.0] - vel[10.0]) / (norms[100.0] - norms[10.0])
A_dir = vel[1.0] - norms[1.0] * B_dir
line_error = float((A_dir + norms[10.0] * B_dir - vel[10.0]).abs().max() / vel[10.0].abs().max())

# %% [markdown]
# The angle between two velocities, measured by its sine, is what no pair of scalars can change:

# %%
sine = lambda a, b: math.sqrt(max(0.0, 1 - float(a @ b / (a.norm() * b.norm())) ** 2))
pairs_of_ratios = ((1.0, 10.0), (1.0, 100.0), (10.0, 100.0))
sines = {f"{a:g}x vs {b:g}x": sine(vel[a], vel[b]) for a, b in pairs_of_ratios}
assert min(sines.values()) > 1e-3

# %%
print(f"collinearity A + cB: relative error {rounding_level(line_error, 1e-10)}; sine of the angle "
      "between velocities: " + ", ".join(f"{k} {fmt(v, 4)}" for k, v in sines.items()))

# %% [markdown]
# The three velocities lie on one line to rounding, yet no two point the same way:
# retuning $\alpha$ per representative cannot align them.

# %% tags=["remove-cell"]
ledger.add("S10", "Raw-proxy velocity gap $-2\\Delta_v \\lVert h\\rVert^4 P(p)^2 p$; no scalar "
           "retuning aligns equivalent updates (general form); the $K = 3$ minor; $K > 3$",
           "$M = " + sp.latex(minor_star) + "$ $\\approx$ " + fmt(float(minor_star), 4),
           details={"velocity formula": "exact (sympy)",
            "autograd rel. deviation, 6 cases": rounding_level(worst_rel, 1e-10),
            "minor at (1/2,3/10,1/5)": minor_star, "minor value": float(minor_star),
            "K = 4, 5, 6 with mass 1/1000": [float(m) for m in minors.values()],
            "random p with nonzero minor": "20000 of 20000",
            "min sine between representatives": min(sines.values())},
           reported="$\\frac{9}{25000} \\log\\frac{640}{6561}$", sig=4)

# %% [markdown]
# ## The function-null mean row runs away
#
# Take the intervention the other way round: gradient *ascent* on $\alpha B_{\mathrm{raw}}$,
# the sharpness-raising regulariser, inside plain SGD with step $\eta$ and (coupled) weight
# decay $\lambda$. Write the objective as $\mathrm{CE} + \sigma\alpha B$ with $\sigma = +1$ for a
# flatness penalty and $\sigma = -1$ for the sharpness-raising ascent. The cross-entropy
# gradient $(p - e_y)h^\top$ and $\nabla_W s = -2\lVert h\rVert^2P(p)ph^\top$ both have zero column
# sums, since $\mathbf 1^\top(p - e_y) = 0$ and $\mathbf 1^\top P(p) = 0$:

# %%
ones = sp.ones(K, 1)
assert sp.expand((ones.T * P).subs(on_simplex)) == sp.zeros(1, K)
assert sp.expand((ones.T * (p_sym - sp.Matrix([0, 1, 0]))).subs(on_simplex)) == sp.zeros(1, 1)

# %% [markdown]
# Sympy then takes the mean row of one SGD step on a generic $3 \times 2$ classifier, with the
# zero-mean gradients written as $\Pi M$ for arbitrary $M$ ($\Pi = I - \mathbf 1\mathbf 1^\top/K$):

# %%
eta, alpha, lam, s_t = sp.symbols("eta alpha lambda s_t", positive=True)
W_sym, Pi = sp.Matrix(K, 2, sp.symbols("w1:7", real=True)), sp.eye(K) - ones * ones.T / K
G_ce, G_s = Pi * sp.Matrix(K, 2, sp.symbols("m1:7")), Pi * sp.Matrix(K, 2, sp.symbols("n1:7"))
mean_row = lambda M: (ones.T * M / K).T
frobenius2 = lambda M: sum(M.multiply_elementwise(M))


# %%
def sgd_step(sigma, W_in_proxy):
    """One SGD step on CE + sigma alpha ||W'||^2 s, W' = W (raw) or Pi W (quotient)."""
    grad_proxy = 2 * s_t * W_in_proxy + frobenius2(W_in_proxy) * G_s
    return W_sym - eta * (G_ce + sigma * alpha * grad_proxy + lam * W_sym)


# %%
raw_factor = {sigma: 1 - eta * lam - 2 * sigma * eta * alpha * s_t for sigma in (1, -1)}
wbar = mean_row(W_sym)
for sigma in (1, -1):
    assert is_identically_zero(mean_row(sgd_step(sigma, W_sym)) - raw_factor[sigma] * wbar)
    assert is_identically_zero(mean_row(sgd_step(sigma, Pi * W_sym)) - (1 - eta * lam) * wbar)

# %%
factor_text = lambda sigma: r"\Big(" + sp.latex(raw_factor[sigma]) + r"\Big)\,\bar w_t"
display(Math(r"\bar w_{t+1} = " + factor_text(-1) + r"\ \ (\text{ascent}),\qquad "
             + factor_text(1) + r"\ \ (\text{penalty})"))

# %% [markdown]
# For the sharpness-raising sign and no weight decay the factor is $1 + 2\eta\alpha s_t$: every
# step multiplies the mean row by more than one, although the mean row never changes a
# probability. The penalty sign gives $1 - 2\eta\alpha s_t$, which shrinks it (and overshoots
# through zero if $2\eta\alpha s_t > 1$). The quotient objective leaves only the weight-decay
# factor $1 - \eta\lambda$ in both cases.
#
# We check the ascent factor on trajectories: a linear softmax classifier on the 64 digit
# pixels (frozen features, $h = x$), full-batch SGD with `lossgeom_book.regularisers.train`, which
# records $\bar w_t$ and $s_t$ at every step. A runaway amplifies whatever it starts from, so
# the mean row starts from a seeded vector with $\lVert \mathbf 1\bar w_0^\top\rVert_F = 1$, far
# above rounding level, beside the seeded centred part of `LinearProbe`; five seeds give five
# runs. One run is $T_{\mathrm{on}}$ steps with the regulariser, then (in the last section)
# $T_{\mathrm{off}}$ steps of cross-entropy alone, recording the test accuracy every 25 steps:

# %%
digit_split = digits(n_train=500, n_test=500, seed=0)
probe_model = tasks.LinearProbe(64, 10, seed=0)
ETA, CAP, T_ON, T_OFF, SEEDS = 0.1, 10.0, 125, 150, range(5)
test_data = (digit_split.x_test, digit_split.y_test)
test_accuracy = lambda step, q: accuracy(probe_model, test_data, params=q)


# %%
def probe_start(seed):
    """Seeded centred classifier plus a seeded mean row with ||1 wbar^T||_F = 1."""
    W_c = softmax.centre(tasks.LinearProbe(64, 10, seed=seed).classifier.weight.detach())
    wbar = torch.randn(64, generator=torch.Generator().manual_seed(1000 + seed))
    return {W_NAME: softmax.common_row_shift(W_c, wbar / (wbar.norm() * math.sqrt(10)))}


# %%
def long_run(objective, alpha, seed):
    schedule = dict(steps_on=T_ON, steps_off=T_OFF, lr=ETA, centred_cap=CAP, record_every=25)
    return regulariser_checks.train_then_remove(
        lambda q, x: x, probe_start(seed), digit_split.x_train, digit_split.y_train,
        objective=objective, alpha=alpha, record=test_accuracy, **schedule)


# %% [markdown]
# Here the centred part of $W$ is kept inside the ball $\lVert W_c\rVert_F \le 10$ (an argument of
# `train`, applied as a projection after each step that leaves $\bar w$ alone): without it the
# ascent also inflates $W_c$, the probabilities saturate, $s_t$ falls to zero and the factor
# returns to one. The cap plays the role of the source's "quotient cap that leaves the
# common-row component unconstrained". We run the raw proxy at $\alpha = 0.01$ for the five
# seeds and compare every step with the recursion:

# %%
runs = {("raw", 0.01, seed): long_run("raw", 0.01, seed) for seed in SEEDS}
histories = [r["history"] for r in runs.values()]
deviation = max(regulariser_checks.runaway_factor_deviation(h, ETA, 0.01) for h in histories)
growth = [float(r["common_row_norm"][-1] / r["common_row_norm"][0]) for r in runs.values()]

# %%
print(f"{T_ON} ascent steps (eta = {fmt(ETA)}, alpha = 0.01), 5 seeds: largest relative deviation "
      f"from wbar_(t+1) = (1 + 2 eta alpha s_t) wbar_t: {rounding_level(deviation, 1e-12)}")
print(f"|wbar| grew by a factor {fmt(np.median(growth), 3)} (median; range {fmt(min(growth), 3)}"
      f" to {fmt(max(growth), 3)})")


# %% [markdown]
# The recursion holds at every step of every trajectory, to rounding, and the mean row grows
# by more than an order of magnitude while no prediction sees it.
#
# Which of these digits mean something? A runaway amplifies, so we test it: five random
# nudges of the seed-0 start, each of relative size $10^{-12}$ (far larger than a change of
# machine makes), rerun at our step size and at $\eta = 0.5$:

# %%
def growth_factor(lr, start):
    _, hist = reg.train(lambda q, x: x, start, digit_split.x_train, digit_split.y_train, lr=lr,
                        objective="raw", alpha=0.01, sign=-1, steps=T_ON, centred_cap=CAP)
    return float(hist["mean_row"][-1].norm() / hist["mean_row"][0].norm())


# %%
base = probe_start(0)[W_NAME]
nudge = lambda k: 1 + 1e-12 * torch.randn(base.shape, generator=torch.Generator().manual_seed(k))
nudged = {lr: [growth_factor(lr, {W_NAME: base * nudge(k)}) for k in range(5)] for lr in (ETA, 0.5)}
spread = {lr: max(values) / min(values) - 1 for lr, values in nudged.items()}

# %%
print(f"eta = {fmt(ETA)}: relative spread of the growth factor "
      f"{rounding_level(spread[ETA], 1e-10)}")
print(f"eta = 0.5: growth factors spread by more than 20%: {'yes' if spread[0.5] > 0.2 else 'no'}")

# %% [markdown]
# At our step size a nudge of $10^{-12}$ moves the growth factor by less than $10^{-10}$ of
# itself, so the three digits printed are the model's. At $\eta = 0.5$ the same nudges move
# it by tens of percent: there the late ascent is chaotic (the growing $\lVert W\rVert_F^2$
# multiplies the ascent on $s$), its digits are the machine's, and only events, such as the
# runaway itself, could be reported.

# %% tags=["remove-cell"]
ledger.add("S11", "Ascent on $\\alpha B_{\\rm raw}$ multiplies the mean row by "
           "$1 + 2\\eta\\alpha s_t$ per SGD step; penalty: $1 - 2\\eta\\alpha s_t$; quotient: "
           "weight decay only",
           "factor $" + sp.latex(raw_factor[-1]) + f"$; $\\lVert\\bar w\\rVert$ grows "
           f"{fmt(np.median(growth), 3)}-fold in {T_ON} steps (median)",
           details={"factor (sympy, with weight decay lambda)": raw_factor[-1],
            "penalty sign": raw_factor[1], "quotient": "$1 - \\eta\\lambda$ (sympy)",
            "trajectory rel. deviation, 5 seeds": rounding_level(deviation, 1e-12),
            f"|wbar| growth in {T_ON} steps, median, min, max": [np.median(growth), min(growth),
                                                                  max(growth)]},
           sig=3)

# %% [markdown]
# ## Paired one-step tests on trained models
#
# Now the experiment of {cite:t}`opazo2026flatness` at CPU scale. We train five kinds of
# classifiers whose last layer is a bias-free $W$: the one-layer transformer on
# $(a + b) \bmod 23$ and on $(a \cdot b) \bmod 23$, a ReLU MLP on $(a - b) \bmod 23$ (all from
# `lossgeom_book.tasks`, half the pairs for training), a ReLU MLP on the digit images trained end
# to end, and a linear probe on that MLP's frozen hidden features. Each is trained with
# full-batch AdamW and three checkpoints are kept along the way. `SCALE` selects the setting;
# `"source"` is the paper's count of ten checkpoints per family (and the modulus 97), which
# takes minutes rather than seconds:

# %%
SCALE = "small"
SETTINGS = {"small": dict(p=23, steps=90, every=30), "source": dict(p=97, steps=3000, every=300)}
cfg = SETTINGS[SCALE]

# %% [markdown]
# The three modular tasks, and the one-layer transformer that two of the families share:

# %%
modular = {op: tasks.modular_arithmetic(cfg["p"], op, train_fraction=0.5, seed=0)
           for op in ("add", "multiply", "subtract")}
transformer = lambda: tasks.ModularTransformer(cfg["p"], d_model=32, n_heads=4, d_mlp=64, seed=0)

# %%
models = {  # name: (model, data, learning rate, weight decay)
    "transformer, a+b": (transformer(), modular["add"], 1e-2, 1.0),
    "transformer, a*b": (transformer(), modular["multiply"], 1e-2, 1.0),
    "MLP, a-b": (tasks.MLPClassifier(None, (128,), cfg["p"], modulus=cfg["p"], seed=0),
                 modular["subtract"], 1e-2, 1.0),
    "digits MLP, end to end": (tasks.MLPClassifier(64, (64,), 10, seed=0), digit_split, 1e-2, 0.1),
}

# %%
fits = {name: tasks.fit(m, data, cfg["steps"], lr=lr, weight_decay=wd, snapshot_every=cfg["every"])
        for name, (m, data, lr, wd) in models.items()}
assert all(r.train_accuracy == 1.0 for r in fits.values())

# %% [markdown]
# Every family fits its training set (asserted); the checkpoints kept and the final accuracies:

# %%
for name, r in fits.items():
    print(f"{name}: {len(r.snapshots)} checkpoints; final train accuracy "
          f"{fmt(r.train_accuracy, 3)}, test {fmt(r.test_accuracy, 3)}")

# %% [markdown]
# All fit their training sets; the modular models have at most partly generalised after so
# few steps, which does not matter here, since the test asks only whether two names of one trained
# predictor move alike. The frozen-feature family trains a probe on the digit MLP's hidden
# features, computed once from the trained MLP:

# %%
digit_mlp = models["digits MLP, end to end"][0]
hidden = lambda x: tasks.features(digit_mlp, dict(digit_mlp.named_parameters()), x).detach()
frozen = Split(hidden(digit_split.x_train), digit_split.y_train, hidden(digit_split.x_test),
               digit_split.y_test, "hidden features of the trained digits MLP")

# %% [markdown]
# then the probe on them, the fifth family, trained like the others:

# %%
models["digits, frozen features"] = (tasks.LinearProbe(64, 10, seed=1), frozen, 1e-2, 0.1)
fits["digits, frozen features"] = tasks.fit(models["digits, frozen features"][0], frozen,
                                            cfg["steps"], 1e-2, 0.1, snapshot_every=cfg["every"])


# %% [markdown]
# At each checkpoint `paired_one_step_test` centres $W$ (itself a function-preserving move)
# and builds shifted twins $W_c + \mathbf 1 v^\top$ with `shift_for_ratio`, which sizes $v$ so
# that $B_{\mathrm{raw}}$ becomes exactly 10 or 100 times its centred value: one twin at 10x
# and two at 100x, along seeded random directions, so 9 pairs per family. The coefficient
# $\alpha$ is calibrated once at the centred model, so that $\alpha B_{\mathrm{quot}}$ is a tenth of
# the cross-entropy there, and reused unchanged at the twins. Every model then takes one
# plain SGD step ($\eta = 0.1$, fresh optimiser state, the full training set) on each of four
# objectives: CE plus $\alpha$ times $B_{\mathrm{raw}}$, $B_{\mathrm{quot}}$ or $\kappa_{\mathrm{exact}}$,
# and plain CE. The pair is first audited with `audit_symmetry` on the test inputs'
# probabilities, and the largest probability difference after the step is recorded.
# `paired_test_on_model` runs the test on a model of `tasks`: features are the classifier's
# inputs, the step uses the training set, and the pair is compared on the test inputs:

# %%
def pairs_at(name, step, params, **kwargs):
    """The paired one-step test at one checkpoint of a family, directions seeded by its step."""
    model, split = models[name][:2]
    return regulariser_checks.paired_test_on_model(model, split, params, seed=step, **kwargs)


# %%
OBJECTIVES = ("raw", "quot", "exact", "ce")
results = [{"family": name, "step": step, **row} for name, r in fits.items()
           for step, params in r.snapshots
           for row in pairs_at(name, step, params, ratios=(10.0, 100.0, 100.0), n_directions=1)]
print(f"{len(results)} pairs, {len(results) * len(OBJECTIVES)} paired steps")

# %% [markdown]
# Before the step, three things hold by construction and are only confirmed: the twin's
# $B_{\mathrm{raw}}$ is the intended multiple of the centred one, $B_{\mathrm{quot}}$ and
# $\kappa_{\mathrm{exact}}$ do not move, and the probabilities agree to rounding:

# %%
ratio_error = max(abs(r["raw_ratio"] / r["ratio"] - 1) for r in results)
invariant_change = max(max(r["quot_change"], r["exact_change"]) for r in results)
gap_before = max(r["before"] for r in results)

# %% [markdown]
# Each is at rounding level, reported by its order against a stated floor:

# %%
print(f"B_raw ratio error {rounding_level(ratio_error, 1e-10)}; change of B_quot, kappa_exact "
      f"{rounding_level(invariant_change, 1e-12)}")
print(f"probability gap {rounding_level(gap_before, 1e-13)}")

# %% [markdown]
# After the step, the same holds for the quotient, exact and cross-entropy objectives, again by
# construction: all three are computed from the centred classifier (or from probabilities),
# so their gradients, and hence their steps, are identical at both members of a pair in exact
# arithmetic, and what the measurement sees is rounding. The raw objective is the one that can
# differ, and the measured probability gap after its step is the finding:
#
# A range is kept as its (smallest, largest) pair and printed as low-high:

# %%
span_of = lambda values: (min(values), max(values))
span = lambda pair, sig=3: f"{fmt(pair[0], sig)}-{fmt(pair[1], sig)}"


# %% [markdown]
# Per family, the raw gaps over all pairs and at 100x, how often predictions differ at 100x,
# and the largest gap of the three aligned objectives:

# %%
def family_summary(rows):
    at_100 = [r for r in rows if r["ratio"] == 100.0]
    return {"raw": span_of([r["raw"] for r in rows]),
            "raw_100": span_of([r["raw"] for r in at_100]),
            "disagree_100": span_of([r["raw_disagree"] for r in at_100]),
            "aligned": max(r[k] for r in rows for k in ("quot", "exact", "ce"))}


# %%
summary = {name: family_summary([r for r in results if r["family"] == name]) for name in fits}
for name, s in summary.items():
    print(f"{name}: raw gap after one step {span(s['raw'])} | quot, exact, CE: "
          f"{rounding_level(s['aligned'], 1e-12)}")

# %%
raw_range = (min(s["raw"][0] for s in summary.values()), max(s["raw"][1] for s in summary.values()))
aligned_gap = max(s["aligned"] for s in summary.values())

# %% tags=["remove-cell"]
glue_value("ch10-npairs", len(results))
glue_value("ch10-raw-range", f"{fmt(raw_range[0], 3)} to {fmt(raw_range[1], 3)}")

# %% [markdown]
# In all {glue:text}`ch10-npairs` pairs the raw-regularised step separates the two
# representatives: their largest class-probability difference after the step ranges from
# {glue:text}`ch10-raw-range`, while the quotient, exact and cross-entropy steps keep every
# pair within rounding. The figure shows
# all pairs; gaps at the level of rounding are drawn at their measured value:

# %% tags=["hide-input"]
pair_contract = MeasurementContract(
    centre="the row-centred checkpoint W_c and its twins W_c + 1 v^T (3 checkpoints per family)",
    directions="v along seeded Gaussian directions (1 at 10x, 2 at 100x)",
    normalisation="|v| set so B_raw(twin) = 10 or 100 x B_raw(W_c)",
    radius="one SGD step, eta = 0.1, fresh optimiser state",
    loss="CE + alpha S, S in {B_raw, B_quot, kappa_exact, 0}; alpha B_quot = CE/10 at W_c",
    reduction="mean over the full training set",
    data="modular a+b, a*b, a-b (p = 23, half the pairs), sklearn digits (500 train)",
    model_mode="n/a (no dropout or batch norm)",
    resolution=f"{len(results)} pairs; gap = max |p - p'| over the test inputs",
    precision="float64",
)
fig, ax = plt.subplots(figsize=(7.4, 3.8))
for j, name in enumerate(fits):
    rows = [r for r in results if r["family"] == name]
    for k, obj in enumerate(OBJECTIVES):
        vals = np.maximum([r[obj] for r in rows], 1e-17)
        ax.scatter(np.full(len(vals), j + (k - 1.5) * 0.18), vals, s=10, color=f"C{k}",
                   label=obj if j == 0 else None)
ax.set_yscale("log")
ax.set_xticks(range(len(fits)), [n.replace(", ", ",\n") for n in fits], fontsize=7)
ax.set_ylabel("max |p - p'| after one step")
ax.legend(ncol=4, fontsize=8)
glue_figure("ch10-pairs", fig, pair_contract,
            "Largest probability difference between two representatives of one predictor after "
            "one matched step")

# %% [markdown]
# ```{glue:figure} fig-ch10-pairs
# :name: fig-ch10-pairs
#
# {glue:text}`cap-ch10-pairs`
#
# {glue:md}`con-ch10-pairs`
# ```
#
# {numref}`fig-ch10-pairs` separates the objectives cleanly: the smallest raw gap lies orders
# of magnitude above every quotient, exact and cross-entropy gap. The source reports the raw
# magnitudes per family at 100x, and for the subtraction MLP how often predictions differ (the
# transformer families have no stated range):

# %%
SOURCE = {"MLP, a-b": ("0.504-0.984", "14.8-21.3%"),
          "digits, frozen features": ("0.184-0.242", "-"),
          "digits MLP, end to end": ("0.990-1.000", "-")}

# %% [markdown]
# Ours, beside them:

# %%
for name, s in summary.items():
    gap, disagree = SOURCE.get(name, ("-", "-"))
    print(f"{name:24s}: raw gap at 100x {span(s['raw_100']):>13} (source {gap}) | predictions "
          f"differ {span([100 * d for d in s['disagree_100']], 2)}% (source {disagree})")

# %% [markdown]
# The raw separation is there in every family, but its size is not the source's: ours is
# far smaller for the subtraction MLP and the end-to-end classifier, and overlaps the source's
# range for the frozen features. The size scales with $\eta\alpha\Delta_v$ and with how far predictions are from
# uniform, and the source does not state the calibration of $\alpha$ or the step. We vary the
# calibration, $\alpha B_{\mathrm{quot}} = f\cdot\mathrm{CE}$ at the centred model for
# $f \in \{0.01, 0.1, 1\}$, on the last checkpoint of each family with one 100x twin:

# %%
FRACTIONS = (0.01, 0.1, 1.0)
last = {name: r.snapshots[-1] for name, r in fits.items()}
sweep = {(name, f): pairs_at(name, *last[name], ratios=(100.0,), n_directions=1, fraction=f,
                             objectives=("raw", "quot"))[0] for name in fits for f in FRACTIONS}
assert all(sweep[(n, 0.01)]["raw"] < sweep[(n, 1.0)]["raw"] for n in fits)

# %%
for name in fits:
    gaps = ", ".join(f"f = {fmt(f)}: {fmt(sweep[(name, f)]['raw'], 3)}" for f in FRACTIONS)
    print(f"{name}: raw gap {gaps}")
sweep_aligned = max(row["quot"] for row in sweep.values())
print(f"quotient gap at every f: {rounding_level(sweep_aligned, 1e-12)}")


# %% [markdown]
# The raw gap grows with $\alpha$ in every family, roughly in proportion while it is small and
# saturating near 1, while the quotient gap stays at rounding level at every calibration:
# whether the raw separation looks small or large depends on the step, whether it is there at
# all does not. Even at $f = 1$ the subtraction MLP and the end-to-end classifier stay below
# the source's ranges, so at our scale the calibration alone does not explain the difference.
#
# Are the models the reason? Ours are small and trained for only 90 steps. If that is why the
# subtraction MLP separates its twins so little, a longer-trained or a wider one should move
# its raw gap toward the source's range. We train the same MLP ten times longer, and one four
# times wider, and repeat the 100x test at $f = 0.1$ on the last checkpoint:

# %%
def subtraction_gap(width, steps):
    """Raw gap and disagreement at a 100x twin, after training a fresh a-b MLP."""
    split = modular["subtract"]
    model = tasks.MLPClassifier(None, (width,), cfg["p"], modulus=cfg["p"], seed=0)
    fit = tasks.fit(model, split, steps, lr=1e-2, weight_decay=1.0, snapshot_every=steps)
    step, params = fit.snapshots[-1]
    row = regulariser_checks.paired_test_on_model(model, split, params, seed=step, ratios=(100.0,),
                                                  n_directions=1, objectives=("raw",))[0]
    return row["raw"], row["raw_disagree"]


# %%
variants = {"10x longer": subtraction_gap(128, 10 * cfg["steps"]),
            "4x wider": subtraction_gap(512, cfg["steps"])}
ab_base = sweep[("MLP, a-b", 0.1)]["raw"]

# %% [markdown]
# Beside the MLP as trained above:

# %%
print(f"MLP, a-b, 128 units, {cfg['steps']} steps (as above): raw gap {fmt(ab_base, 2)}")
for name, (gap, disagree) in variants.items():
    print(f"MLP, a-b, {name}: raw gap {fmt(gap, 2)}, predictions differ {fmt(100 * disagree, 2)}%")

# %%
assert all(gap < ab_base for gap, _ in variants.values())  # both move away from the source's range

# %% tags=["remove-cell"]
glue_value("ch10-ab-base", ab_base, 2)
glue_value("ch10-ab-longer", variants["10x longer"][0], 2)
glue_value("ch10-ab-wider", variants["4x wider"][0], 2)


# %% [markdown]
# Both go the other way: the raw gap falls from {glue:text}`ch10-ab-base` to
# {glue:text}`ch10-ab-longer` with ten times the training and to {glue:text}`ch10-ab-wider` with
# four times the width. Neither the calibration, nor the training length, nor the width brings
# the subtraction MLP toward the source's 0.504-0.984; what does, we have not found, and the
# end-to-end gap (a ResNet-18 on CIFAR-10 in the source) we cannot test at this scale.
#
# The source also looks at the gradient itself (its Fig. 2b): it reports that at a 100x
# twin the raw gradient over all parameters differs from the centred one by about 99
# centred-gradient norms, while probabilities agree to below $5.11 \times 10^{-15}$. For
# $B_{\mathrm{raw}} = \lVert W\rVert_F^2 s$ the gradient in the non-classifier parameters is
# exactly $r$ times the centred one at an $r$-fold twin, so a ratio near $r - 1$ is expected
# wherever those parameters carry most of the gradient; `gradient_gap_at_ratio` measures it on
# the transformer checkpoints, between the centred classifier and its twin along the all-ones
# direction:

# %%
def gradient_gap(name, params, proxy):
    """Gradient gap of a proxy on the training set between W_c and its 100x twin."""
    model, split = models[name][:2]
    score = lambda q: reg.PROXIES[proxy](q[W_NAME], tasks.features(model, q, split.x_train))
    return regulariser_checks.gradient_gap_at_ratio(score, params, 100.0)


# %%
transformers = ("transformer, a+b", "transformer, a*b")
checkpoints = [(n, q) for n in transformers for _, q in fits[n].snapshots]
grad_ratio = {proxy: [gradient_gap(n, q, proxy) for n, q in checkpoints]
              for proxy in ("raw", "quot", "exact")}

# %% [markdown]
# The raw proxy's gap in centred-gradient norms, and the largest gap of the two invariant ones:

# %%
invariant_grad = max(max(grad_ratio["quot"]), max(grad_ratio["exact"]))
print(f"raw: gradient gap {fmt(np.median(grad_ratio['raw']), 3)} centred norms (median of 6; "
      f"range {span(span_of(grad_ratio['raw']))}); quot, exact: "
      f"{rounding_level(invariant_grad, 1e-10)}")

# %% tags=["remove-cell"]
glue_value("ch10-gradgap", np.median(grad_ratio["raw"]), 3)

# %% [markdown]
# The raw gradient moves by {glue:text}`ch10-gradgap` centred norms (median), close to the
# $r - 1$ the scaling predicts and to the source's report, while the quotient and exact
# gradients agree to rounding: again by construction,
# since both are computed from the centred classifier. One more number from the same
# checkpoints: $B_{\mathrm{quot}}$ is far from tight, its ratio to $\kappa_{\mathrm{exact}}$ (the
# subject of claim S14, examined in {ref}`ch-softmax-gauge-source`) is

# %%
for name in fits:
    ratios = [r["quot_over_exact"] for r in results if r["family"] == name]
    print(f"{name}: B_quot / kappa_exact {span(span_of(ratios))} over its 3 checkpoints")


# %% [markdown]
# an order of magnitude or more, though below the 102.95-108.44 the source reports at its
# centred modular checkpoints.
#
# ### A temporal null
#
# Does the diagnostic value of $B_{\mathrm{raw}}$ say anything about *when* a model
# generalises? The source's temporal null holds $B_{\mathrm{raw}}$ at 100 times its paired
# control value throughout training while everything else matches, and finds the same grokking
# onset in all five pairs. At our scale: an MLP on $(a + b) \bmod 23$ with 70% of the pairs for
# training (AdamW, learning rate 0.05, weight decay 1, 200 steps), where test accuracy stays
# near zero for a while after the training set is memorised and rises later. After every step,
# `fix_raw_ratio` resets only the function-null coordinate: to the centred classifier in the control, to
# $W_c + \mathbf 1v^\top$ with $B_{\mathrm{raw}} = 100\,B_{\mathrm{quot}}$ in the twin. The onset is the
# first checkpoint (every 10 steps) at which test accuracy reaches 0.1. Each run trains a
# fresh seeded MLP and holds the common row after every step:

# %%
def null_run(seed, ratio):
    split = tasks.modular_arithmetic(23, "add", train_fraction=0.7, seed=seed)
    model = tasks.MLPClassifier(None, (64,), 23, modulus=23, seed=seed)
    direction = torch.randn(64, generator=torch.Generator().manual_seed(seed))
    fit = tasks.fit(model, split, 200, lr=0.05, weight_decay=1.0, snapshot_every=10,
                    project=regulariser_checks.fix_raw_ratio(ratio, direction))
    return model, split, fit


# %% [markdown]
# `compare_null_runs` reads off a control and its twin: both onsets, the checkpoint at which
# the control's training accuracy reaches 1, the probability gap at every checkpoint, and the
# ratio of their $B_{\mathrm{raw}}$ at the end:

# %%
def null_pair(seed):
    (model, split, control), (_, _, twin) = null_run(seed, 1.0), null_run(seed, 100.0)
    return regulariser_checks.compare_null_runs(model, split, control, twin, onset_level=0.1)


# %%
null = [null_pair(seed) for seed in range(5)]
onsets = [pair["onsets"] for pair in null]
assert all(o[0] is not None and o[0] == o[1] for o in onsets)
null_gap, null_ratio = max(max(p["gaps"]) for p in null), [p["raw_ratio"] for p in null]

# %% [markdown]
# When the runs memorise and when they generalise, the $B_{\mathrm{raw}}$ ratio, and how far
# the twins drift apart:

# %%
memorised = max(p["memorised"] for p in null)
print(f"training set memorised (train accuracy 1) by step {memorised} in every run; "
      f"onset steps (control, twin): {onsets}")
print(f"B_raw ratio twin/control at the end {span(span_of(null_ratio), 4)}")
print(f"largest probability gap along the runs: {rounding_level(null_gap, 1e-8)}")

# %% [markdown]
# The gap between the twins at the first checkpoint (step 10) and at the last (step 200), over
# the five pairs:

# %%
first_gap, last_gaps = max(p["gaps"][0] for p in null), [p["gaps"][-1] for p in null]
assert first_gap < 1e-13 < min(last_gaps)
print(f"first checkpoint, largest gap: {rounding_level(first_gap, 1e-13)}; last checkpoint, "
      f"every pair above 1e-13: {'yes' if min(last_gaps) > 1e-13 else 'no'}")

# %% tags=["remove-cell"]
glue_value("ch10-null-first", rounding_level(first_gap, 1e-13))

# %% [markdown]
# All five pairs generalise at the same checkpoint while $B_{\mathrm{raw}}$ differs a
# hundredfold. This too is an identity in exact arithmetic (cross-entropy, its gradients and
# AdamW's state see only the centred classifier); what the run shows is that rounding does
# not separate the pairs: the probability gap grows along the runs, from
# {glue:text}`ch10-null-first` at the first checkpoint to above $10^{-13}$ at the last in
# every pair, which is why the floor for the whole run is set at $10^{-8}$, and stays below
# it. What it means is that the value of $B_{\mathrm{raw}}$ alone cannot determine
# generalisation.
#
# The ledger rows of this chapter's experiments follow one rule: a row holds at our scale only
# if every level the source states is met here, or a computation here accounts for the
# difference. For the paired tests, the separation by the raw step and the alignment of the
# invariant objectives hold in every pair, but the sizes stated for the subtraction MLP and
# the end-to-end classifier are not met, and nothing we tested (calibration, training length,
# width) accounts for them, so the row differs.

# %% tags=["remove-cell"]
ledger.add("S12", "Paired one-step tests: shifts make $B_{\\rm raw}$ 10x, 100x its centred value; "
           "after one matched step raw separates equivalent models, quot/exact/CE stay aligned",
           f"raw gap {fmt(raw_range[0], 3)} to {fmt(raw_range[1], 3)} in all {len(results)} pairs; "
           f"quot/exact/CE "
           f"{rounding_level(aligned_gap, 1e-12)}",
           details={"pairs (families x 3 checkpoints x 3 twins)": len(results), "families": len(fits),
            "raw gap after one step, all pairs": list(raw_range),
            **{f"{name}: raw gap at 100x": list(s["raw_100"]) for name, s in summary.items()},
            "MLP, a-b: predictions differ at 100x": list(summary["MLP, a-b"]["disagree_100"]),
            "quot/exact/CE gap after (identity)": rounding_level(aligned_gap, 1e-12),
            "probability gap before (identity: the shift is function-null)":
                rounding_level(gap_before, 1e-13),
            "raw gradient gap at 100x, centred norms (the scaling predicts about r - 1)":
                np.median(grad_ratio["raw"]),
            "temporal null: equal onsets (identity in exact arithmetic)":
                f"{sum(o[0] == o[1] for o in onsets)} of 5",
            "MLP, a-b: raw gap at 100x, f = 0.1, as trained / 10x longer / 4x wider":
                [float(fmt(gap, 2)) for gap in (ab_base, *(g for g, _ in variants.values()))]},
           reported={"pairs": 45, "quotient differences": "below 1e-12",
                     "MLP a-b": "0.504-0.984, 14.8-21.3% disagreement", "frozen": "0.184-0.242",
                     "end to end": "0.990-1.000", "raw gradient gap at 100x": "about 99 norms",
                     "temporal null": "identical onsets in 5 of 5"},
           status="differs", sig=3,
           note=f"raw separates all {len(results)} pairs, quot/exact/CE stay at rounding (an "
                f"identity); raw gaps at 100x fall short: a-b MLP "
                f"{span(summary['MLP, a-b']['raw_100'])}, end to end "
                f"{span(summary['digits MLP, end to end']['raw_100'])}; calibration (swept), 10x "
                "training, 4x width do not close it (tested); reason untested")

# %% [markdown]
# ## Raising sharpness over a long horizon
#
# The last question is what the intervention does to a training run. We train the pixel
# probe from the seeded start above for $T_{\mathrm{on}} = 125$ steps on $\mathrm{CE} - \alpha S$ (the
# sharpness-raising sign), then remove the regulariser and train $T_{\mathrm{off}} = 150$ more steps
# on cross-entropy alone, with the same cap throughout, for the raw and the quotient proxy at
# $\alpha = 0.01$ beside a cross-entropy control, five seeds each (the raw runs are those of
# the runaway section):

# %%
runs.update({("quot", 0.01, seed): long_run("quot", 0.01, seed) for seed in SEEDS})
runs.update({("ce", 0.0, seed): long_run("ce", 0.0, seed) for seed in SEEDS})


# %% [markdown]
# Per seed, a run counts as *suppressed* when its test accuracy at the end of the regularised
# phase is at least 0.2 below the paired control's, and as *recovered* when its accuracy after
# removal is within 0.05 of the control's; these events, and the medians in percentage points,
# are what we report:

# %%
def long_summary(obj):
    pairs = [(runs[(obj, 0.01, s)], runs[("ce", 0.0, s)]) for s in SEEDS]
    trail = [100 * (c["on"][-1] - r["on"][-1]) for r, c in pairs]
    rise = [100 * (r["off"][-1] - r["on"][-1]) for r, c in pairs]
    recovered = sum(c["off"][-1] - r["off"][-1] <= 0.05 for r, c in pairs)
    suppressed = sum(t >= 20 for t in trail)
    return {"suppressed": suppressed, "recovered": recovered, "trail": trail, "rise": rise}


# %%
s13 = {obj: long_summary(obj) for obj in ("raw", "quot")}
for obj, v in s13.items():
    print(f"{obj:4s} alpha=0.01: suppressed in {v['suppressed']}/5, recovered in "
          f"{v['recovered']}/5; trails the control by {fmt(np.median(v['trail']), 2)} points "
          f"(median), rises by {fmt(np.median(v['rise']), 2)} points after removal")

# %% [markdown]
# The medians carry two digits, what five small runs support; at this step size the runs are
# not chaotic (the nudge test above), so these digits do not depend on the machine. Only the
# raw proxy moves the common row: under the quotient its norm stays exactly at its start (no term
# of the objective touches it), under the raw proxy it grows geometrically. We report the
# runaway as an event: the step at which the common-row norm first reaches ten times its start:

# %%
passed = lambda norm: (norm >= 10 * norm[0]).nonzero().flatten().tolist()
crossings = [(passed(runs[("raw", 0.01, s)]["common_row_norm"]) or [None])[0] for s in SEEDS]
n_crossed = sum(c is not None for c in crossings)
bracket = (10 * (min(crossings) // 10), 10 * (max(crossings) // 10 + 1))

# %% [markdown]
# We report the crossing steps to the nearest ten below and above, beside the quotient run's
# change of the norm:

# %%
quot_growth = max(abs(float(runs[("quot", 0.01, s)]["common_row_norm"][-1]) - 1) for s in SEEDS)
print(f"raw: common-row norm passes 10x its start in {n_crossed}/5 seeds, between steps "
      f"{bracket[0]} and {bracket[1]}; quotient: change {rounding_level(quot_growth, 1e-12)}")

# %% tags=["hide-input"]
long_contract = pair_contract.with_(
    centre="seeded linear softmax probe on the 64 pixels, ||1 wbar^T||_F = 1 at start (5 seeds)",
    directions="full-batch SGD trajectory",
    normalisation=f"centred part projected onto |W_c|_F <= {fmt(CAP)} after each step",
    radius=f"{T_ON} steps with the regulariser, {T_OFF} without, eta = {fmt(ETA)}",
    loss="CE - 0.01 S (sharpness-raising), then CE", data="sklearn digits, 500 train / 500 test",
    resolution="test accuracy every 25 steps; common-row norm every step",
)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8.6, 3.4), layout="constrained")
styles = {"raw": ("-", "C0"), "quot": ("--", "C1"), "ce": (":", "C2")}
for (obj, _, seed), run in runs.items():
    style, color = styles[obj]
    acc = run["on"] + run["off"][1:]
    label = obj if seed == 0 else None
    ax1.plot(np.arange(len(acc)) * 25, acc, style, color=color, lw=1, label=label)
    ax2.semilogy(run["common_row_norm"].numpy(), style, color=color, lw=1)
ax1.axvline(T_ON, color="grey", lw=0.8)
ax1.set_xlabel("step (regulariser removed at the line)")
ax1.set_ylabel("test accuracy")
ax1.legend(fontsize=7)
ax2.set_xlabel("step (regulariser on)")
ax2.set_ylabel(r"common-row norm $\sqrt{K}\,\|\bar w\|$")
glue_figure("ch10-long", fig, long_contract,
            "Left: test accuracy with the sharpness-raising regulariser on, then removed (5 seeds "
            "each). Right: the function-null common-row norm")

# %% [markdown]
# ```{glue:figure} fig-ch10-long
# :name: fig-ch10-long
#
# {glue:text}`cap-ch10-long`
#
# {glue:md}`con-ch10-long`
# ```
#
# In {numref}`fig-ch10-long` the raw and quotient runs share the accuracy story but not the
# gauge story: raising either proxy suppresses test accuracy and removing it restores it, but
# at equal $\alpha$ the raw proxy suppresses more, because its effective weight
# $\alpha\lVert W\rVert_F^2$ grows with the runaway of a coordinate that no prediction sees.
#
# The same rule decides S13. Its events hold: both proxies suppress accuracy, removing them
# restores it, and the raw proxy's common row runs away. Its sizes do not. We compare the
# raw runs with the levels the source states, a median trail of 10.61 points (range
# 7.04-16.58), a rise of 11.90 points after removal (range 8.48-17.11), and a common-row norm
# that later exceeds $10^3$:

# %%
raw_trail, raw_rise = np.median(s13["raw"]["trail"]), np.median(s13["raw"]["rise"])
final_norms = [float(runs[("raw", 0.01, s)]["common_row_norm"][-1]) for s in SEEDS]

# %% [markdown]
# The events hold in every seed, and each size lies on the far side of the source's level:

# %%
assert all(v["suppressed"] == v["recovered"] == 5 for v in s13.values()) and n_crossed == 5
assert raw_trail > 16.58 and raw_rise > 17.11  # above the reported ranges
assert all(abs(float(runs[("raw", 0.01, s)]["common_row_norm"][0]) - 1) < 1e-12 for s in SEEDS)
assert max(final_norms) < 1e3

# %% tags=["remove-cell"]
glue_value("ch10-s13-trail", fmt(raw_trail, 2))
glue_value("ch10-s13-rise", fmt(raw_rise, 2))
glue_value("ch10-s13-norm", fmt(max(final_norms), 3))

# %% [markdown]
# The raw runs trail the control by {glue:text}`ch10-s13-trail` points (median) and rise by
# {glue:text}`ch10-s13-rise` after removal, both above the reported ranges, and the common-row
# norm, which starts at 1, reaches at most {glue:text}`ch10-s13-norm` in this horizon, far
# short of $10^3$. Nothing computed here accounts for the difference (a linear probe on digit
# pixels is not the source's CIFAR-10 network, and we did not vary $\alpha$ or the horizon),
# so the row differs.

# %% tags=["remove-cell"]
ledger.add("S13", "Long horizon, small scale: sharpness-raising suppresses accuracy, removal "
           "recovers; raw common-row norm runs away",
           f"raw: median trail {fmt(raw_trail, 2)}, rise {fmt(raw_rise, 2)} points; common-row "
           f"norm 1 → {fmt(max(final_norms), 3)} at most",
           details={"setting": f"linear probe on digit pixels, {T_ON}+{T_OFF} SGD steps, centred "
                               f"part capped at {fmt(CAP)}, 5 seeds",
            **{f"{obj}: suppressed, recovered (of 5)": [v["suppressed"], v["recovered"]]
               for obj, v in s13.items()},
            **{f"{obj}: median trail, rise (points)": [np.median(v["trail"]), np.median(v["rise"])]
               for obj, v in s13.items()},
            "raw: passes 10x its start": f"{n_crossed} of 5, steps {bracket[0]}-{bracket[1]}",
            f"raw: growth in {T_ON} steps, median": np.median(growth),
            "quot: common-row change": rounding_level(quot_growth, 1e-12)},
           reported="CIFAR-10: trail 10.61 points (7.04-16.58), rise 11.90 (8.48-17.11); "
                    "runaway threshold crossed at epoch 4, common-row norm later above 1e3",
           status="differs", sig=2,
           note=f"events hold (suppression and recovery for both proxies, raw runaway); sizes do "
                f"not: raw median trail {fmt(raw_trail, 2)} and rise {fmt(raw_rise, 2)} points, "
                f"above the reported ranges; common-row norm at most {fmt(max(final_norms), 3)}, "
                "not above 1e3; nothing here accounts for it")

# %% [markdown]
# ## What this establishes
#
# The atlas rows {ref}`B_raw <atlas-b-raw>`, {ref}`B_quot <atlas-b-quot>` and
# {ref}`kappa_exact <atlas-kappa-exact>` record which of the three objectives' values
# survive each symmetry.
#
# ```{admonition} What you now know, and what does not follow
# :class: important
# **You now know**
# - that a regulariser acts on the function through its velocity {eq}`eq-ch10-velocity`, a
#   property of the predictor only if it is the same at every parameter point that implements
#   it, and that of the three requirements the raw bound meets only approximation validity;
# - that the raw bound's velocity gap is $-2\Delta_v\lVert h\rVert^4P(p)^2p$, that no scalar
#   retuning closes it, and that as an intervention it feeds a coordinate no prediction sees;
# - that on trained models the raw step separates every pair, by an amount that depends on
#   the step, and the gradient of a 100x twin moves by about {glue:text}`ch10-gradgap`
#   centred norms, while centring removes all three defects.
#
# **What does not follow**
# - that centring repairs flatness in general: it removes the defects for the softmax
#   common-row symmetry only, the quotient bound is still a loose upper bound on
#   $\kappa_{\mathrm{exact}}$, and raising it still suppresses accuracy;
# - the size of the effects at the source's scale: the long runs here are a linear probe on
#   digits, far from the source's CIFAR-10 ResNets, so they show the mechanism rather than
#   its size.
# ```
#
# ## Exercises
#
# ```{admonition} Exercise: the penalty sign
# :class: tip
# Run `reg.train` on the raw proxy with the *penalty* sign ($\sigma = +1$) instead of the
# ascent, $\alpha = 0.01$, for 50 steps from `probe_start(0)`. Predict what the common-row norm
# does. (Hint: the factor per step derived above.)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# The factor is $1 - 2\eta\alpha s_t < 1$, so the mean row shrinks every step, geometrically,
# towards the centred classifier: the penalty sign pulls the raw proxy towards the quotient.
# The recursion still holds to rounding. The cell below checks both.
# ```

# %% tags=["hide-cell"]
_, penalty = reg.train(
    lambda q, x: x,
    probe_start(0),
    digit_split.x_train,
    digit_split.y_train,
    objective="raw",
    alpha=0.01,
    sign=1,
    steps=50,
    lr=ETA,
    weight=W_NAME,
)
shrink = float(penalty["mean_row"][-1].norm() / penalty["mean_row"][0].norm())
assert (
    shrink < 1 and regulariser_checks.runaway_factor_deviation(penalty, ETA, 0.01, sign=1) < 1e-12
)
print(f"common-row norm after 50 penalty steps: x{fmt(shrink, 3)}")

# %% [markdown]
# ```{admonition} Exercise: ascent on the exact contraction
# :class: tip
# Replace the raw proxy by $\kappa_{\mathrm{exact}}$ (`objective="exact"`) in the sharpness-raising
# run. Predict the common-row norm after 50 steps.
# ```
#
# ```{admonition} Solution
# :class: dropdown
# $\kappa_{\mathrm{exact}}$ depends on $W$ only through the centred classifier, so its gradient has
# zero column sums, like the cross-entropy gradient; without weight decay the mean row does not
# move at all, whatever happens to the predictions.
# ```

# %% tags=["hide-cell"]
_, exact_run = reg.train(lambda q, x: x, probe_start(0), digit_split.x_train, digit_split.y_train,
                         objective="exact", alpha=0.01, sign=-1, steps=50, lr=ETA, weight=W_NAME)
norms_exact = exact_run["mean_row"].norm(dim=1)
change = float((norms_exact / norms_exact[0] - 1).abs().max())
print(f"largest relative change of |wbar| over 50 steps: {rounding_level(change, 1e-12)}")

# %% [markdown]
# ```{admonition} Exercise: a smaller shift
# :class: tip
# In the paired test, use a twin at 2x instead of 100x on the last checkpoint of the subtraction
# MLP. Predict the raw gap after one step relative to the 100x twin. (Hint: the velocity gap
# {eq}`eq-ch10-gap` is proportional to $\Delta_v$.)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# At a centred checkpoint $\Delta_v = (r - 1)\lVert W_c\rVert_F^2$, so to first order in the step the
# gap scales like $r - 1$: about $1/99$ of the 100x gap while both are small. The cell below
# checks that the ratio is close to $1/99$.
# ```

# %% tags=["hide-cell"]
gap_at = lambda r: pairs_at("MLP, a-b", *last["MLP, a-b"], ratios=(r,), n_directions=1,
                            objectives=("raw",))[0]["raw"]
relative = gap_at(2.0) / gap_at(100.0)
assert 0.5 / 99 < relative < 2 / 99
print(f"raw gap at 2x / raw gap at 100x = {fmt(relative, 3)} (1/99 = {fmt(1 / 99, 3)})")

# %% [markdown]
# ## Results ledger

# %%
ledger

# %% [markdown]
# The other claims of the same series are established in the two chapters before this one:
# S1-S4 and S14 in {numref}`Chapter %s <ch-softmax-gauge>`, S5-S9 in
# {numref}`Chapter %s <ch-certificates>`.
