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
# (ch-certificates)=
# # Certificates need the first-order term
#
# Can a curvature bound at a minimum of the training loss be turned into a robustness
# certificate, a radius inside which no example's loss rises by more than a tolerance?
# {cite:t}`walter2026flatness` invert the last-layer relative-flatness proxy of
# {numref}`Chapter %s <ch-softmax-gauge>` into such a radius, keeping second- and
# third-order terms and dropping the first-order one on the grounds that the gradient
# vanishes at a minimum. It vanishes for the *average* loss, not for each example. This
# chapter follows {cite:t}`opazo2026flatness`: it derives, exactly, a three-example dataset
# minimum where the certified radius contains a perturbation that raises one example's loss
# more than two hundred times above the published expression, derives a sound replacement
# that keeps the first-order term, shows its constant cannot be improved, and measures both
# on the learned features of networks trained here.
#
# **Claims established here:** S5, S6, S7, S8, S9.
#
# The tools are the same as in the previous chapter, plus `lossgeom.certificates`:

# %%
import numpy as np
import sympy as sp
import torch
import matplotlib.pyplot as plt
from IPython.display import Math, display
from myst_nb import glue

from lossgeom import certificates as cert
from lossgeom import data
from lossgeom import softmax as sm
from lossgeom.contract import MeasurementContract
from lossgeom.display import fmt, glue_figure, Plain, use_book_style
from lossgeom.ledger import Ledger

torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)
use_book_style()
ledger = Ledger("Chapter 8: certificates need the first-order term")

# %% [markdown]
# ## The first-order obstruction
#
# Let $\ell$ be differentiable at a feature $h$ with gradient $g_h \ne 0$. Along
# $d_\rho = \rho\, g_h / \lVert g_h\rVert$ Taylor's theorem gives
#
# $$
# \ell(h + d_\rho) - \ell(h) = \rho \lVert g_h \rVert + o(\rho),
# $$ (eq-ch08-first-order)
#
# so any expression $q(\rho) = o(\rho)$, a quadratic-plus-cubic one included, is eventually
# smaller than the loss increase. Sympy makes this concrete for one logistic example,
# $\ell(s) = \log(1 + e^{-\beta s})$, against a generic $q(\rho) = a\rho^2 + b\rho^3$:

# %%
rho, beta, s0 = sp.symbols("rho beta s0", positive=True)
a_q, b_q = sp.symbols("a b", positive=True)
ell = lambda s: sp.log(1 + sp.exp(-beta * s))
slope = sp.Abs(sp.diff(ell(s0), s0))
first_order = sp.limit((ell(s0 - rho) - ell(s0)) / rho, rho, 0)  # -s is the ascent direction
assert sp.simplify(first_order - slope) == 0
assert sp.limit((a_q * rho**2 + b_q * rho**3) / rho, rho, 0) == 0
display(Math(r"\lim_{\rho\to 0}\frac{\ell(s_0 - \rho) - \ell(s_0)}{\rho} = " + sp.latex(sp.simplify(first_order))
             + r" = |\ell'(s_0)| > 0, \qquad \lim_{\rho\to0} \frac{a\rho^2 + b\rho^3}{\rho} = 0"))
ledger.add("S5", "Along the loss gradient in feature space the increase is rho ||g_h|| + o(rho): no o(rho) expression bounds it",
           {"limit of increase / rho": "|l'(s0)| = " + str(sp.simplify(first_order)), "limit of q / rho": 0})

# %% [markdown]
# At a minimum of the *dataset* loss the per-example gradients cancel on average, but
# each one can be far from zero; the next section builds such a minimum.
#
# ## A finite dataset minimum
#
# Two classes, a one-dimensional feature $\phi(x) = x$, and the multiset
# $S = [(1, 1), (1, 1), (1, 0)]$ of (input, label) pairs. Binary softmax sees the
# classifier $W = (w_0, w_1)^\top$ only through $\beta = w_1 - w_0$, and the empirical risk is
#
# $$
# R(\beta) = \tfrac23 \log(1 + e^{-\beta}) + \tfrac13 \log(1 + e^{\beta}).
# $$ (eq-ch08-risk)
#
# Sympy finds the unique minimiser, and checks that no single example is stationary there:

# %%
b = sp.symbols("beta", real=True)
R = sp.Rational(2, 3) * sp.log(1 + sp.exp(-b)) + sp.Rational(1, 3) * sp.log(1 + sp.exp(b))
roots = sp.solve(sp.diff(R, b), b)
second = sp.simplify(sp.diff(R, b, 2))
assert roots == [sp.log(2)]
assert sp.simplify(second - sp.exp(b) / (1 + sp.exp(b)) ** 2) == 0  # > 0: R is strictly convex
per_example = [sp.diff(sp.log(1 + sp.exp(-b)), b), sp.diff(sp.log(1 + sp.exp(b)), b)]  # label 1, label 0
grads_at_min = [sp.nsimplify(sp.simplify(g.subs(b, sp.log(2)))) for g in per_example]
assert grads_at_min == [sp.Rational(-1, 3), sp.Rational(2, 3)]
display(Math(r"R'(\beta) = 0 \iff \beta = " + sp.latex(roots[0]) + r",\quad R'' = " + sp.latex(second)
             + r" > 0,\quad \ell_1'(\log 2) = " + sp.latex(grads_at_min[0]) + r",\ \ell_0'(\log 2) = " + sp.latex(grads_at_min[1])))

# %% [markdown]
# So every minimiser is $(c, c + \log 2)^\top$, one point up to the common-row shift, and
# $W_\star = (0, \log 2)^\top$ is the representative with $c = 0$; there $p = (1/3, 2/3)$ on
# every example, and the gradients $-1/3, -1/3, 2/3$ average to zero without vanishing.
# Now move the input of one class-1 example from $x = 1$ to $x = 0.99$ (a step of
# $\delta = 0.01$ along that example's loss gradient) and evaluate the published expression
# $\frac{\delta^2}{2r^2} B_{\rm raw}(W_\star, \phi(x)) + \frac{\delta^3}{24 r^3} K m$ with
# the values that satisfy its assumptions: $K = 2$, $m = d = 1$ and the feature lower bound
# $r = 0.99$ on $\mathcal{X} = [0.99, 1]$:

# %%
delta, r_low, K2, m1 = sp.Rational(1, 100), sp.Rational(99, 100), 2, 1
increase = sp.log(1 + 2 ** -sp.Rational(99, 100)) - sp.log(sp.Rational(3, 2))
p_star = sp.Matrix([sp.Rational(1, 3), sp.Rational(2, 3)])
B_raw_star = (0**2 + sp.log(2) ** 2) * 1**2 * (1 - (p_star.T * p_star)[0])
published = delta**2 / (2 * r_low**2) * B_raw_star + delta**3 / (24 * r_low**3) * K2 * m1
ratio = increase / published
display(Math(r"\ell_1(0.99) - \ell_1(1) = " + sp.latex(increase) + r" \approx " + sp.latex(sp.N(increase, 4))
             + r",\quad B_{\rm raw}(W_\star, 1) = " + sp.latex(B_raw_star)))
display(Math(r"\text{published expression} = " + sp.latex(sp.N(published, 4)) + r",\qquad \text{ratio} = " + sp.latex(sp.N(ratio, 5))))
assert sp.N(ratio) > 210

# %% [markdown]
# The same numbers through the package, in float64 (`lossgeom.certificates.loss_increase`
# evaluates $\log(1 + \sum_{k \ne y} p_k \operatorname{expm1}(\delta_k - \delta_y))$ so that
# small increases keep their digits):

# %%
W_star = torch.tensor([[0.0], [float(np.log(2.0))]])
h_star = torch.tensor([1.0])
inc_num = float(cert.loss_increase(W_star, h_star, 1, torch.tensor([-0.01])))
b_num = float(sm.b_raw(W_star, h_star))
pub_num = cert.published_expression(0.01, b_num, r=0.99, K=2, m=1)
assert abs(inc_num / float(increase) - 1) <= 1e-12 and abs(pub_num / float(published) - 1) <= 1e-12
pub_centred = cert.published_expression(0.01, float(sm.b_quot(W_star, h_star)), r=0.99, K=2, m=1)
print(f"loss increase {fmt(inc_num, 4)}, published expression {fmt(pub_num, 4)}, ratio {fmt(inc_num / pub_num, 5)}")
print(f"at the centred representative (-log2/2, log2/2) the same expression is {fmt(pub_centred, 4)}: "
      f"ratio {fmt(inc_num / pub_centred, 5)}")
glue("ch08-increase", inc_num, display=False)
glue("ch08-published", pub_num, display=False)
glue("ch08-ratio", inc_num / pub_num, display=False)
ledger.add("S6", "At the finite dataset minimum W*=(0, log 2) the move x=1 -> 0.99 for y=1 raises the loss far above the published expression",
           {"minimiser beta*": "log(2) (sympy, unique)", "loss increase": inc_num, "published expression": pub_num,
            "ratio": inc_num / pub_num, "ratio at centred W": inc_num / pub_centred},
           reported="2.32e-3 vs 1.10e-5, over 210x")

# %% [markdown]
# The loss rises by {glue:text}`ch08-increase:.3g`, the expression allows
# {glue:text}`ch08-published:.3g`: a factor {glue:text}`ch08-ratio:.4g`, matching the reported
# 2.32e-3, 1.10e-5 and "over 210" to the stated digits. At the centred representative
# of the same minimiser the expression is smaller still, because $B_{\rm raw}$ halves: the
# gauge of {numref}`Chapter %s <ch-softmax-gauge>` and the missing first-order term are two
# separate defects.
#
# ## The falsely certified radius
#
# Setting the published expression equal to a tolerance $\epsilon$ and solving for $\delta$
# gives the radius it certifies. At $\epsilon = 10^{-4}$, with the same $r = 0.99$, the
# expression is a cubic in $\delta$ that increases on $\delta > 0$, so it has one positive
# root; sympy finds it to 30 digits, and `lossgeom.certificates.published_radius`
# (Brent's method) agrees:

# %%
d_sym = sp.symbols("delta", positive=True)
eps = sp.Rational(1, 10**4)
expression = d_sym**2 / (2 * r_low**2) * B_raw_star + d_sym**3 / (24 * r_low**3) * K2 * m1
radius_exact = sp.nsolve(expression - eps, d_sym, 0.03, prec=30)
radius_num = cert.published_radius(1e-4, b_num, r=0.99, K=2, m=1)
assert abs(radius_num / float(radius_exact) - 1) <= 1e-12
assert 0.01 < radius_num and inc_num > 1e-4
print(f"certified radius delta_pub = {fmt(radius_num, 6)} (feature lower bound r = 0.99); "
      f"the step 0.01 lies inside it and raises the loss by {fmt(inc_num, 4)} > tolerance 1e-4")
ledger.add("S7", "The published expression certifies a radius at tolerance 1e-4 that contains the violating perturbation",
           {"delta_pub (r = 0.99)": radius_num, "violating step": 0.01, "its loss increase": inc_num}, reported=2.99e-2)

# %% [markdown]
# ## A sound bound
#
# Keep the first-order term and bound the second-order one uniformly. For target $y$ the
# feature gradient is $g_h = W^\top(p - e_y)$ and the feature Hessian at $h + t d$ is
# $W^\top P(q_t) W$. For a unit vector $u$, $u^\top W^\top P(q) W u$ is the variance of the
# scalar $u^\top w_C$ with $C \sim \operatorname{Cat}(q)$, at most a quarter of its squared
# range (Popoviciu's inequality), hence at most $D_W^2/4$ with
# $D_W = \max_{i,j}\lVert w_i - w_j\rVert$. Taylor's theorem and Cauchy-Schwarz then give,
# for every $d$,
#
# $$
# \ell_y(h + d) - \ell_y(h) \le \lVert d\rVert \lVert g_h\rVert + \frac{D_W^2}{8}\lVert d\rVert^2,
# \qquad
# \rho_{\rm cert} = \frac{2\epsilon}{\lVert g_h\rVert + \sqrt{\lVert g_h\rVert^2 + D_W^2\epsilon/2}} .
# $$ (eq-ch08-sound)
#
# Sympy checks the pieces: the binary variance $q(1-q)\Delta^2$ is at most $\Delta^2/4$ with
# equality only at $q = 1/2$; along the row difference of a balanced binary classifier the
# remainder after the linear term is $D_W^2 s^2/8 + O(s^4)$, so the constant $D_W^2/4$ is
# attained and no smaller uniform constant is valid; the radius is the positive root of the
# bound; and the gradient does not see a common-row shift, because $\mathbf{1}^\top(p - e_y) = 0$:

# %%
q, Dw, s, g, e_sym = sp.symbols("q D s g epsilon", positive=True)
slack = Dw**2 / 4 - q * (1 - q) * Dw**2
assert sp.factor(slack) == Dw**2 * (2 * q - 1) ** 2 / 4
loss_balanced = sp.log(1 + sp.exp(-Dw * s))  # label 0 row minus label 1 row = D u, logits equal at s = 0
remainder = sp.series(loss_balanced - loss_balanced.subs(s, 0) - sp.diff(loss_balanced, s).subs(s, 0) * s, s, 0, 4).removeO()
assert sp.simplify(remainder - Dw**2 * s**2 / 8) == 0
roots_rho = sp.solve(sp.Eq(rho * g + Dw**2 / 8 * rho**2, e_sym), rho)
closed_radius = 2 * e_sym / (g + sp.sqrt(g**2 + Dw**2 * e_sym / 2))
assert len(roots_rho) == 1 and sp.simplify(roots_rho[0] - closed_radius) == 0
pv, ev, vv, w0, w1 = sp.symbols("p_0 e_0 v w_0 w_1", real=True)
residual = sp.Matrix([pv - ev, (1 - pv) - (1 - ev)])
assert sp.expand((sp.Matrix([w0, w1]) + vv * sp.ones(2, 1)).T * residual - sp.Matrix([w0, w1]).T * residual) == sp.zeros(1, 1)
display(Math(r"\tfrac{D^2}{4} - q(1-q)D^2 = " + sp.latex(sp.factor(slack)) + r",\quad \text{remainder} = "
             + sp.latex(remainder) + r" + O(s^4),\quad \rho_{\rm cert} = " + sp.latex(closed_radius)))

# %% [markdown]
# On the counterexample the bound covers the violating step with little room, and the
# radius it certifies at $\epsilon = 10^{-4}$ is far smaller than the published one:

# %%
bound_star = float(cert.sound_bound(W_star, h_star, 1, 0.01))
rho_star = float(cert.sound_radius(W_star, h_star, 1, 1e-4))
assert inc_num <= bound_star
at_radius = float(cert.loss_increase(W_star, h_star, 1, torch.tensor([-rho_star])))
assert at_radius <= 1e-4
print(f"step 0.01: increase {fmt(inc_num, 5)} <= sound bound {fmt(bound_star, 5)} (bound/actual {fmt(bound_star / inc_num, 5)})")
print(f"sound radius at 1e-4: {fmt(rho_star, 4)} (published: {fmt(radius_num, 4)}); "
      f"loss increase at the sound radius {fmt(at_radius, 4)}")


# %% [markdown]
# Next, the bound on random instances: 120 classifiers with 2 to 10 classes, feature
# dimension 1 to 8 and row scales from 0.1 to 10, each with 10 features, random labels,
# and perturbations in random directions and along the gradient, of sizes from $10^{-4}$
# to 10; we record the smallest bound/actual ratio among the positive increases:

# %%
def random_trials(n_classifiers=120, seed=0):
    gen = torch.Generator().manual_seed(seed)
    worst, count = np.inf, 0
    for i in range(n_classifiers):
        K_i, d_i = int(torch.randint(2, 11, (1,), generator=gen)), int(torch.randint(1, 9, (1,), generator=gen))
        W = 10 ** (2 * torch.rand(1, generator=gen) - 1) * torch.randn(K_i, d_i, generator=gen)
        h = torch.randn(10, d_i, generator=gen)
        y = torch.randint(0, K_i, (10,), generator=gen)
        g_unit = cert.feature_gradient(W, h, y)
        g_unit = g_unit / g_unit.norm(dim=-1, keepdim=True)
        for size in (1e-4, 1e-2, 1.0, 10.0):
            for direction in (torch.randn(10, d_i, generator=gen), g_unit):
                d = size * direction / direction.norm(dim=-1, keepdim=True)
                actual = cert.loss_increase(W, h, y, d)
                bound = cert.sound_bound(W, h, y, d.norm(dim=-1))
                positive = actual > 0
                count += int(positive.sum())
                worst = min(worst, float((bound[positive] / actual[positive]).min()))
    return worst, count


# %%
worst_ratio, n_positive = random_trials()
assert worst_ratio >= 1 - 1e-10
print(f"{n_positive} positive loss increases: smallest bound/actual ratio >= 1 - 1e-10 (never violated beyond rounding); "
      f"the closest cases are small steps along the gradient, where the bound is tight")

# %% [markdown]
# Finally, shift invariance: on a random 5-class classifier a large common-row shift leaves
# the sound radius unchanged and moves the published one (computed here with
# $r = \lVert h\rVert$, $m = d$):

# %%
gen = torch.Generator().manual_seed(1)
W5, h5, y5 = torch.randn(5, 3, generator=gen), torch.randn(3, generator=gen), 2
v5 = 4.0 * torch.randn(3, generator=gen)
W5s = sm.common_row_shift(W5, v5)
sound_gap = float(abs(cert.sound_radius(W5s, h5, y5, 0.1) / cert.sound_radius(W5, h5, y5, 0.1) - 1))
pub = [cert.published_radius(0.1, float(sm.b_raw(Wx, h5)), r=float(h5.norm()), K=5, m=3) for Wx in (W5, W5s)]
assert sound_gap <= 1e-12 and sm.max_probability_gap(W5, W5s, h5, tol=1e-12) <= 1e-12
print(f"||W + 1v^T||^2 / ||W||^2 = {fmt(float((W5s**2).sum() / (W5**2).sum()), 4)}: sound radius unchanged to 1e-12, "
      f"published radius {fmt(pub[0], 4)} -> {fmt(pub[1], 4)}")
ledger.add("S8", "l(h+d)-l(h) <= ||d|| ||g_h|| + D_W^2/8 ||d||^2; the Hessian constant D_W^2/4 is sharp; radius formula; shift invariant",
           {"sharpness": "remainder D^2 s^2/8 + O(s^4) at a balanced binary softmax (sympy)",
            "counterexample bound/actual at 0.01": bound_star / inc_num, "sound radius at 1e-4": rho_star,
            "random positive increases": n_positive, "smallest bound/actual": ">= 1 - 1e-10"})

# %% [markdown]
# ## On learned features
#
# Does the omitted term matter on trained representations, or only in a constructed
# example? We train five MLPs 64-64-10 (ReLU, seeds 0-4; heavy-ball SGD, learning rate 0.1,
# 150 full-batch steps) on 600 digit images as in {numref}`Chapter %s <ch-softmax-gauge>` and take the 400 held-out images: 2,000
# (model, image) pairs. Each feature $h$ (the 64 hidden units) is moved along
# $u = g_h/\lVert g_h\rVert$, with the image's true label, by $d = \Delta \lVert h\rVert u$.
# The *retained raw quadratic* is the published expression's quadratic with the most
# favourable feature bound $r = \lVert h\rVert$, $\tfrac{\Delta^2}{2} B_{\rm raw}(W, h)$:

# %%
split = data.digits(n_train=600, n_test=400, seed=0)
models = [sm.train_classifier(sm.init_classifier([64, 64, 10], seed=seed), split.x_train, split.y_train,
                              steps=150, lr=0.1)[0] for seed in range(5)]
accs = [float((sm.classifier_logits(mp, split.x_test).argmax(-1) == split.y_test).double().mean()) for mp in models]
print(f"5 MLPs: test accuracy {fmt(min(accs), 3)} to {fmt(max(accs), 3)}")

# %% [markdown]
# For each $\Delta$ we record, per pair, the realised increase, the retained quadratic, the
# linear term and the sound bound:

# %%
DELTAS = (1e-5, 1e-4, 1e-3, 3e-3, 1e-2)


def responses(params, x, y, deltas=DELTAS):
    W, h = params["weight"], sm.classifier_features(params, x)
    g = cert.feature_gradient(W, h, y)
    u = g / g.norm(dim=-1, keepdim=True)
    out = {}
    for dlt in deltas:
        size = dlt * h.norm(dim=-1)
        out[dlt] = dict(actual=cert.loss_increase(W, h, y, size[:, None] * u), raw=cert.raw_quadratic(W, h, size),
                        linear=size * g.norm(dim=-1), bound=cert.sound_bound(W, h, y, size))
    return out


per_model = [responses(mp, split.x_test, split.y_test) for mp in models]
pooled = {dlt: {key: torch.cat([pm[dlt][key] for pm in per_model]).numpy() for key in ("actual", "raw", "linear", "bound")}
          for dlt in DELTAS}
n_pairs = len(pooled[DELTAS[0]]["actual"])
assert n_pairs >= 1000

# %% [markdown]
# The summary per $\Delta$, next to Table 1 of {cite:t}`opazo2026flatness` (ResNet-18
# penultimate features on CIFAR-10, 10,240 pairs; only the entries the text states are
# filled in):

# %%
REPORTED = {1e-5: {"tight_median": 1.039, "tight_p90": 1.093}, 1e-3: {"lin_raw": 10.60}}
summary = {}
for dlt in DELTAS:
    r_ = pooled[dlt]
    summary[dlt] = dict(exceed=float(np.mean(r_["actual"] > r_["raw"])), lin_raw=float(np.median(r_["linear"] / r_["raw"])),
                        covered=float(np.mean(r_["actual"] <= r_["bound"])),
                        tight_median=float(np.median(r_["bound"] / r_["actual"])), tight_p90=float(np.quantile(r_["bound"] / r_["actual"], 0.9)))
print(f"{'Delta':>6} | {'actual>raw':>10} {'(rep.)':>7} | {'lin/raw':>8} {'(rep.)':>7} | {'covered':>7} {'(rep.)':>7} | "
      f"{'bound/actual median':>19} {'(rep.)':>7} | {'p90':>6} {'(rep.)':>7}")
for dlt, row in summary.items():
    rep = REPORTED.get(dlt, {})
    rep_exceed = "100%" if dlt <= 3e-3 else "-"
    cell = lambda key, sig=4: fmt(rep[key], sig) if key in rep else "-"
    print(f"{fmt(dlt):>6} | {fmt(100 * row['exceed'], 4) + '%':>10} {rep_exceed:>7} | {fmt(row['lin_raw'], 4):>8} {cell('lin_raw'):>7} | "
          f"{fmt(100 * row['covered'], 4) + '%':>7} {'100%':>7} | {fmt(row['tight_median'], 4):>19} {cell('tight_median'):>7} | "
          f"{fmt(row['tight_p90'], 4):>6} {cell('tight_p90'):>7}")

# %% [markdown]
# The sound bound covers every response, and at the smallest $\Delta$ its median is within a
# few percent of the realised increase; its 90th percentile is looser than reported,
# because many of our examples are so confident that $\lVert g_h\rVert$ is tiny and the
# uniform curvature term $D_W^2/8$ dominates. The realised increase exceeds the retained
# quadratic in every pair up to $\Delta = 10^{-3}$. The ratio of the linear term to the
# retained quadratic is $2\lVert g_h\rVert / (\Delta \lVert h\rVert \lVert W\rVert_F^2
# (1 - \lVert p\rVert^2))$, so it scales exactly like $1/\Delta$
# ({numref}`fig-ch08-learned`); the informative number is its level, here below the
# reported 10.60 at $\Delta = 10^{-3}$:

# %%
scaled = {dlt: summary[dlt]["lin_raw"] * dlt for dlt in DELTAS}
spread = max(scaled.values()) / min(scaled.values())
all_covered = all(row["covered"] == 1.0 for row in summary.values())
assert all_covered and spread <= 1 + 1e-9
print(f"median(linear/raw) x Delta = {fmt(scaled[1e-3], 4)} at every Delta (max/min - 1 <= 1e-9)")

# %%
learned_contract = MeasurementContract(
    centre="penultimate features h of 5 trained 64-64-10 ReLU MLPs (seeds 0-4), one per held-out image",
    directions="u = g_h / ||g_h||, the feature gradient of the true-label loss",
    normalisation="step d = Delta ||h|| u (relative to the feature norm)", radius="Delta in {1e-5, 1e-4, 1e-3, 3e-3, 1e-2}",
    loss="softmax cross-entropy of one example", reduction="none (per pair); medians and 90th percentiles",
    data=f"{n_pairs} (model, image) pairs: 400 held-out digits images x 5 models", model_mode="n/a (no layers with state)",
    resolution="5 values of Delta", precision="float64",
)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8.4, 3.4))
ds = np.array(DELTAS)
ax1.loglog(ds, [summary[dl]["lin_raw"] for dl in DELTAS], "o-", label="median linear / raw quadratic")
ax1.loglog(ds, scaled[1e-3] / ds, ":", color="k", label="1/Delta slope")
ax1.plot([1e-3], [10.60], "s", color="grey", label="reported at 1e-3 (ResNet-18)")
ax1.set_xlabel("Delta")
ax1.legend(fontsize=7)
for dlt in (1e-5, 1e-3, 1e-2):
    ax2.hist(np.log10(pooled[dlt]["bound"] / pooled[dlt]["actual"]), bins=40, histtype="step", label=f"Delta = {fmt(dlt)}")
ax2.set_xlabel("log10(sound bound / realised increase)")
ax2.legend(fontsize=7)
glue_figure("ch08-learned", fig, learned_contract,
    "Left: the omitted linear term relative to the retained raw quadratic scales like 1/Delta. "
    "Right: tightness of the sound bound (0 = equality; never negative)")


# %% [markdown]
# ```{glue:figure} fig-ch08-learned
# :name: fig-ch08-learned
#
# {glue:text}`cap-ch08-learned`
# ```
#
# Two more rows of the comparison. First, the radius from raw curvature alone: where
# $\tfrac12\rho^2 \lVert W\rVert_F^2(1 - \lVert p\rVert^2)$ reaches the tolerance 0.10, how
# often does the loss along $u$ at that radius rise above 0.10?

# %%
def curvature_only_failures(params, x, y, epsilon=0.10):
    W, h = params["weight"], sm.classifier_features(params, x)
    g = cert.feature_gradient(W, h, y)
    rho_raw = cert.curvature_only_radius(W, h, epsilon)
    return cert.loss_increase(W, h, y, rho_raw[:, None] * g / g.norm(dim=-1, keepdim=True)) > epsilon


fail_share = float(torch.cat([curvature_only_failures(mp, split.x_test, split.y_test) for mp in models]).double().mean())
print(f"curvature-only radius at tolerance 0.10 admits an increase above 0.10 for {fmt(100 * fail_share, 4)}% of {n_pairs} pairs "
      f"(reported: 24.43%)")


# %% [markdown]
# Second, the gauge: for each model a common-row shift along the mean-row direction that
# makes $\lVert W\rVert_F^2$ 100 times larger. The raw quadratic of every pair is
# multiplied by exactly that factor, while probabilities and loss responses do not move:

# %%
def shifted_copy(params, factor=100.0):
    W = params["weight"]
    v = sm.shift_for_norm_factor(W, sm.mean_row(W), factor)  # ||W + 1 v^T||_F^2 = factor ||W||_F^2
    return {**params, "weight": sm.common_row_shift(W, v)}


raw_factor, prob_gap, response_gap = [], 0.0, 0.0
for mp in models:
    shifted = shifted_copy(mp)
    base, moved = responses(mp, split.x_test, split.y_test, (1e-3,)), responses(shifted, split.x_test, split.y_test, (1e-3,))
    raw_factor.append((moved[1e-3]["raw"] / base[1e-3]["raw"]).numpy())
    h = sm.classifier_features(mp, split.x_test)
    prob_gap = max(prob_gap, sm.max_probability_gap(mp["weight"], shifted["weight"], h, tol=1e-12))
    response_gap = max(response_gap, float((moved[1e-3]["actual"] - base[1e-3]["actual"]).abs().max()))
raw_factor = np.concatenate(raw_factor)
assert np.abs(raw_factor / 100 - 1).max() <= 1e-9 and prob_gap <= 1e-12 and response_gap <= 1e-12
print(f"raw quadratic x{fmt(float(np.median(raw_factor)), 6)} for every pair; probabilities and loss responses "
      f"differ by at most 1e-12 (reported: x100, at most 3.8e-14)")

# %% [markdown]
# The shift multiplies the certificate's curvature term a hundredfold and leaves the
# function, and therefore every loss response, unchanged. We enter the comparison in the
# ledger:

# %%
glue("ch08-fail-share", Plain(fmt(100 * fail_share, 3) + "%"), display=False)
ledger.add("S9", "On learned features: realised increase vs retained quadratic, linear/quadratic ~ 1/Delta, sound bound covers every response",
           {"pairs": n_pairs, "actual > raw quadratic, Delta <= 3e-3": [summary[dl]["exceed"] for dl in DELTAS if dl <= 3e-3],
            "median linear/raw at 1e-3": summary[1e-3]["lin_raw"], "median(linear/raw) x Delta max/min": spread,
            "sound bound covers": "all 5 x 2000 responses" if all_covered else "not all",
            "bound/actual median, p90 at 1e-5": [summary[1e-5]["tight_median"], summary[1e-5]["tight_p90"]],
            "curvature-only radius fails at tol 0.10": fail_share, "raw quadratic factor under matched shift": float(np.median(raw_factor))},
           reported="Table 1 of seed 004 (ResNet-18 CIFAR-10, 10,240 pairs): actual>raw 100% through Delta=3e-3; median linear/raw 10.60 "
                    "at 1e-3; bound covers all 71,680 responses; bound/actual 1.039 (median), 1.093 (p90) at 1e-5; "
                    "curvature-only failures 24.43% at 0.10; shift x100 with changes <= 3.8e-14",
           status="holds at our scale",
           note="digits MLP features (2,000 pairs) instead of ResNet-18 CIFAR-10 features (10,240 pairs): coverage and the "
                "qualitative pattern hold; the levels differ (linear/raw, p90 tightness, failure share, exceedance at 3e-3) "
                "because they depend on the model's confidence and feature geometry")

# %% [markdown]
# ## What this establishes
#
# A curvature bound is not a certificate: at a minimum of the average loss, each example
# keeps a first-order term, and the three-example minimum shows the published expression
# understating a loss increase by a factor {glue:text}`ch08-ratio:.4g` inside the radius it
# certifies. Keeping the gradient and bounding the curvature by the row diameter gives a
# bound that is valid everywhere, cannot be sharpened in its constant, is the same at every
# representative of the softmax gauge, and on learned features is close to the realised
# increase for small steps. On our features the curvature-only radius admits an increase
# above tolerance for {glue:text}`ch08-fail-share` of pairs. The bound is a feature-space
# statement; turning it into an input-space certificate needs a separately justified
# Lipschitz constant for the feature map, which this chapter does not supply.
#
# ## Results ledger

# %%
ledger
