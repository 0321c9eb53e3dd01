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
# (ch-softmax-gauge)=
# # The softmax gauge
#
# A softmax classifier does not see its weight matrix, only the differences between its
# rows: adding one vector to every row adds the same number to every logit, and softmax
# removes it. Which last-layer flatness numbers notice this *gauge* freedom, and how large
# is it in classifiers as they come out of training? This chapter derives, exactly, the
# curvature of softmax cross-entropy in the classifier, the last-layer relative flatness
# $\kappa_{\rm exact}$ of {cite:t}`petzka2021relative`, the operational upper bound
# $B_{\rm raw}$ used for certificates {cite}`walter2026flatness` and as a regulariser
# {cite}`han2025flatness`, and its orbit-minimised version $B_{\rm quot}$, following
# {cite:t}`opazo2026flatness`. It then measures the gauge in small classifiers trained
# here on sklearn's digits, sweeping the settings that decide it instead of tuning one run.
#
# **Claims established here:** S1, S2, S3, S4, S14.
#
# We load sympy for the exact work, torch in float64 (one thread, so that timings under
# load stay short and results identical), and the book's package:

# %%
import numpy as np
import sympy as sp
import torch
import matplotlib.pyplot as plt
from IPython.display import Math, display
from myst_nb import glue
from scipy.optimize import minimize

from lossgeom import data
from lossgeom import softmax as sm
from lossgeom.contract import MeasurementContract
from lossgeom.curvature import dense_hessian
from lossgeom.display import fmt, glue_figure, Plain, use_book_style
from lossgeom.ledger import Ledger
from lossgeom.symmetries import audit_symmetry

torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)
use_book_style()
ledger = Ledger("Chapter 7: the softmax gauge")

# %% [markdown]
# ## One matrix, two meanings
#
# A classifier $W \in \mathbb{R}^{K \times d}$ maps a feature $h \in \mathbb{R}^d$ to
# logits $z = W h$ and probabilities $p = \operatorname{softmax}(z)$. The matrix
#
# $$
# P(p) = \operatorname{Diag}(p) - p p^\top
# $$ (eq-ch07-cov)
#
# is both the covariance of the one-hot label $e_Y$ with $Y \sim \operatorname{Cat}(p)$
# and the Jacobian $\partial p / \partial z$. We check both for $K = 3$, writing
# $u_k = e^{z_k}$ so that every entry is a rational function sympy can cancel exactly:

# %%
K3 = 3
z = sp.symbols("z0:3", real=True)
u = sp.symbols("u0:3", positive=True)
to_u = {sp.exp(zk): uk for zk, uk in zip(z, u)}
p_of_z = sp.Matrix([sp.exp(zk) for zk in z]) / sum(sp.exp(zk) for zk in z)
p = p_of_z.subs(to_u)
P = sp.diag(*p) - p * p.T
onehot = sp.eye(K3)
label_cov = sum((p[k] * (onehot[:, k] - p) * (onehot[:, k] - p).T for k in range(K3)), sp.zeros(K3, K3))
jacobian = p_of_z.jacobian(z).subs(to_u)
assert (label_cov - P).applyfunc(sp.cancel) == sp.zeros(K3, K3)
assert (jacobian - P).applyfunc(sp.cancel) == sp.zeros(K3, K3)
assert (P * sp.ones(K3, 1)).applyfunc(sp.cancel) == sp.zeros(K3, 1)
display(Math(r"\mathbb{E}\big[(e_Y - p)(e_Y - p)^\top\big] = \frac{\partial p}{\partial z} = " + sp.latex(P.subs({u[0]: sp.Symbol("u_0")}))))

# %% [markdown]
# Both agree with {eq}`eq-ch07-cov` entry by entry, and $P(p)\mathbf{1} = 0$: a common logit
# offset is invisible to first order, as it must be.
#
# ## The classifier Hessian
#
# For one example with label $y$, cross-entropy is
# $\ell = \log \sum_k e^{z_k} - z_y$. Its Hessian in the logits is $P(p)$, and since
# $z = W h$ is linear in $W$ with Jacobian $I_K \otimes h^\top$ (row-major
# $\operatorname{vec} W$), the Hessian in the classifier is
#
# $$
# \nabla^2_{W} \ell = (I_K \otimes h^\top)^\top P(p)\, (I_K \otimes h^\top) = P(p) \otimes h h^\top .
# $$ (eq-ch07-hessian)
#
# Sympy confirms both steps, the second for a general symmetric $P$ and $d = 2$:

# %%
ce = sp.log(sum(sp.exp(zk) for zk in z)) - z[0]
assert (sp.hessian(ce, z).subs(to_u) - P).applyfunc(sp.cancel) == sp.zeros(K3, K3)
W_sym = sp.Matrix(K3, 2, sp.symbols("w0:6", real=True))
h_sym = sp.Matrix(sp.symbols("h0:2", real=True))
J_W = (W_sym * h_sym).jacobian(list(W_sym))
P_gen = sp.Matrix(K3, K3, lambda i, j: sp.Symbol(f"P_{min(i, j)}{max(i, j)}"))
assert sp.expand(J_W.T * P_gen * J_W - sp.kronecker_product(P_gen, h_sym * h_sym.T)) == sp.zeros(6, 6)
display(Math(r"J_W = " + sp.latex(J_W)))

# %% [markdown]
# Numerically, on a digit image (average-pooled to 4 x 4, so $d = 16$) with a random
# classifier, the torch autograd Hessian of cross-entropy
# (`lossgeom.curvature.dense_hessian`) matches {eq}`eq-ch07-hessian` built from
# `lossgeom.softmax.covariance`:

# %%
split = data.digits(n_train=600, n_test=400, seed=0)
x0 = torch.nn.functional.avg_pool2d(split.x_train[0].reshape(1, 8, 8), 2).reshape(16)
y0 = split.y_train[0]
W_rand = 0.3 * torch.randn(10, 16, generator=torch.Generator().manual_seed(0))
ce_of_W = lambda params: torch.nn.functional.cross_entropy((params["W"] @ x0)[None], y0[None])
hess = dense_hessian(ce_of_W, {"W": W_rand})
kron = torch.kron(sm.covariance(sm.probabilities(W_rand, x0)), torch.outer(x0, x0))
hess_err = float((hess - kron).abs().max() / kron.abs().max())
assert hess_err <= 1e-12
print(f"160 x 160 Hessian: largest |autograd - P kron hh^T| / largest entry <= 1e-12")

# %% [markdown]
# ## Exact contraction and its upper bound
#
# The last-layer relative flatness of {cite:t}`petzka2021relative` contracts this Hessian
# with the layer's own scale,
#
# $$
# \kappa_{\rm exact}(W, h) = \lVert h \rVert^2 \operatorname{Tr}\big(W^\top P(p)\, W\big),
# \qquad
# B_{\rm raw}(W, h) = \lVert W \rVert_F^2 \lVert h \rVert^2 \big(1 - \lVert p \rVert^2\big).
# $$ (eq-ch07-kappa)
#
# $B_{\rm raw}$ is the bound used in practice. The gap between them is a trace of a product
# of two positive semi-definite matrices, $P(p)$ and $\lVert W\rVert_F^2 I - W W^\top$,
# hence non-negative; and $\operatorname{Tr} P(p) = 1 - \lVert p \rVert^2$. Sympy checks the
# identity for a general $p$ and $W$:

# %%
p0, p1 = sp.symbols("p0 p1", positive=True)
p_sym = sp.Matrix([p0, p1, 1 - p0 - p1])  # a point of the simplex
P_sym = sp.diag(*p_sym) - p_sym * p_sym.T
fro2 = sum(w**2 for w in W_sym)
gap = fro2 * P_sym.trace() - (W_sym.T * P_sym * W_sym).trace()
assert sp.expand(gap - (P_sym * (fro2 * sp.eye(K3) - W_sym * W_sym.T)).trace()) == 0
assert sp.expand(P_sym.trace() - (1 - (p_sym.T * p_sym)[0])) == 0
display(Math(r"\lVert W\rVert_F^2 \operatorname{Tr}P - \operatorname{Tr}(W^\top P W) = "
             r"\operatorname{Tr}\big(P\,(\lVert W\rVert_F^2 I - W W^\top)\big) \ge 0"))

# %% [markdown]
# The package computes $\kappa_{\rm exact}$ as $\lVert h\rVert^2$ times the variance of the
# row $w_C$ under $C \sim \operatorname{Cat}(p)$, which is the same trace. We compare it with
# the dense trace on 50 digit images:

# %%
h50 = split.x_train[:50]
W_rand = 0.3 * torch.randn(10, 64, generator=torch.Generator().manual_seed(1))
dense_kappa = torch.stack([(x @ x) * torch.trace(W_rand.T @ sm.covariance(sm.probabilities(W_rand, x)) @ W_rand) for x in h50])
kappa_err = float(((sm.kappa_exact(W_rand, h50, reduction="none") - dense_kappa).abs() / dense_kappa).max())
assert kappa_err <= 1e-12
print(f"kappa_exact vs dense ||h||^2 Tr(W^T P W): largest relative difference {fmt(kappa_err, 2)} (tolerance 1e-12)")

# %% [markdown]
# ## The common-row orbit
#
# The gauge transform $G_v(W) = W + \mathbf{1} v^\top$ leaves $p$ unchanged, and with it
# $\kappa_{\rm exact}$, because $P(p)\mathbf{1} = 0$. $B_{\rm raw}$ changes through
# $\lVert W \rVert_F^2$. Along the line $W + t \mathbf{1} v^\top$ the norm is a quadratic
# in $t$ with leading coefficient $K \lVert v\rVert^2$, so $B_{\rm raw}$ grows without
# bound; minimising over $v$ gives the unique stationary point $v = -\bar w$ (the mean
# row), where the Hessian $2K I$ is positive definite. So the centred
# $W_c = W - \mathbf{1}\bar w^\top$ is the unique minimum-norm representative, with the
# orthogonal split $\lVert W\rVert_F^2 = \lVert W_c\rVert_F^2 + K \lVert \bar w \rVert^2$:

# %%
t = sp.symbols("t", real=True)
v_sym = sp.Matrix(sp.symbols("v0:2", real=True))
ones = sp.ones(K3, 1)
norm2 = lambda M: sum(m**2 for m in M)
orbit_norm = sp.expand(norm2(W_sym + t * ones * v_sym.T))
quadratic = norm2(W_sym) + 2 * t * (ones.T * W_sym * v_sym)[0] + t**2 * K3 * norm2(v_sym)
assert sp.expand(orbit_norm - quadratic) == 0
assert sp.limit(quadratic.subs({v_sym[0]: 1, v_sym[1]: 0}), t, sp.oo) == sp.oo
wbar = W_sym.T * ones / K3
stationary = sp.solve([sp.diff(norm2(W_sym + ones * v_sym.T), vi) for vi in v_sym], list(v_sym), dict=True)
assert len(stationary) == 1 and sp.simplify(sp.Matrix([stationary[0][vi] for vi in v_sym]) + wbar) == sp.zeros(2, 1)
assert sp.hessian(norm2(W_sym + ones * v_sym.T), list(v_sym)) == 2 * K3 * sp.eye(2)
W_c = W_sym - ones * wbar.T
assert sp.expand(norm2(W_sym) - norm2(W_c) - K3 * norm2(wbar)) == 0
display(Math(r"\lVert W + t\mathbf{1}v^\top\rVert_F^2 = \lVert W\rVert_F^2 + 2t\,\mathbf{1}^\top W v + t^2 K\lVert v\rVert^2,"
             r"\qquad \arg\min_v = -\bar w"))

# %% [markdown]
# Consequently $B_{\rm quot}(W, h) = \lVert W_c\rVert_F^2 \lVert h\rVert^2 (1 - \lVert p\rVert^2)
# = \inf_v B_{\rm raw}(G_v(W), h)$, and since $P = \Pi P \Pi$ with the centring projector
# $\Pi$, centring keeps $\kappa_{\rm exact}$, so
# $\kappa_{\rm exact} \le B_{\rm quot} \le B_{\rm raw}$. Both $\kappa_{\rm exact}$ and
# $B_{\rm quot}$ are constant along the orbit, so their gradients are too.
#
# To check this on a real classifier we train a linear softmax model ($h$ = the 64 pixels)
# on 600 digit images with full-batch heavy-ball SGD (`lossgeom.softmax.train_classifier`;
# learning rate 0.1, momentum 0.9, 150 steps, no weight decay):

# %%
x_train, y_train = split.x_train, split.y_train
linear, _ = sm.train_classifier(sm.init_classifier([64, 10], seed=0), x_train, y_train, steps=150, lr=0.1)
W_lin = linear["weight"]
test_acc = float((sm.classifier_logits(linear, split.x_test).argmax(-1) == split.y_test).double().mean())
print(f"linear softmax model: test accuracy {fmt(test_acc, 3)} on {len(split.y_test)} held-out images")

# %% [markdown]
# The symmetry audit of {numref}`Chapter %s <ch-object-and-metric>` (`lossgeom.symmetries.audit_symmetry`) applies a
# shift $v$ along the mean-row direction, chosen so that $\lVert W \rVert_F^2$ grows
# 100-fold, checks that the probabilities on the 400 test images agree, and only then
# recomputes $B_{\rm raw}$:

# %%
direction = sm.mean_row(W_lin) / sm.mean_row(W_lin).norm()
v100 = sm.shift_for_norm_factor(W_lin, direction, 100.0)  # ||W + 1 v^T||_F^2 = 100 ||W||_F^2
softmax_forward = lambda params, x: torch.softmax(x @ params["weight"].T, dim=-1)
report = audit_symmetry(softmax_forward, {"weight": W_lin}, sm.row_shift_symmetry(v100), split.x_test,
                        tol=1e-12, measure=lambda q: float(sm.b_raw(q["weight"], split.x_test)), measure_name="B_raw")
print(report)

# %% [markdown]
# The probabilities agree to rounding while $B_{\rm raw}$ is 100 times larger. The two
# invariant quantities and their gradients do not move, and $B_{\rm quot}$ equals the
# numerical minimum of $B_{\rm raw}$ over all shifts (scipy's BFGS with autograd gradients):

# %%
W_far = sm.common_row_shift(W_lin, v100)
h_test = split.x_test
for name, f in (("kappa_exact", sm.kappa_exact), ("B_quot", sm.b_quot)):
    value_gap = float(abs(f(W_far, h_test) / f(W_lin, h_test) - 1))
    g0, g1 = (torch.func.grad(lambda w: f(w, h_test))(Wx) for Wx in (W_lin, W_far))
    grad_gap = float((g1 - g0).norm() / g0.norm())
    assert value_gap <= 1e-9 and grad_gap <= 1e-8
    print(f"{name}: relative change of value <= 1e-9, of gradient <= 1e-8 under the 100x shift")


def b_raw_and_grad(v):
    v = torch.from_numpy(v).requires_grad_(True)
    value = sm.b_raw(sm.common_row_shift(W_lin, v), h_test)
    return float(value.detach()), torch.autograd.grad(value, v)[0].numpy()


best = minimize(b_raw_and_grad, np.zeros(64), jac=True, method="BFGS", options={"gtol": 1e-10})
orbit_min_gap = abs(best.fun / float(sm.b_quot(W_lin, h_test)) - 1)
argmin_gap = float(np.abs(best.x + sm.mean_row(W_lin).numpy()).max())
assert orbit_min_gap <= 1e-8 and argmin_gap <= 1e-5
print("BFGS over all 64 shift coordinates: min_v B_raw / B_quot - 1 <= 1e-8, at v = -(mean row) to within 1e-5")

# %% [markdown]
# Finally the ordering holds example by example on all 400 test images:

# %%
k_i, q_i, r_i = (f(W_lin, h_test, reduction="none") for f in (sm.kappa_exact, sm.b_quot, sm.b_raw))
assert bool(torch.all(k_i <= q_i) and torch.all(q_i <= r_i * (1 + 1e-14)))
print(f"kappa_exact <= B_quot <= B_raw on {len(k_i)} of {len(k_i)} test images; "
      f"median B_quot / kappa_exact = {fmt(float((q_i / k_i).median()), 4)}")

# %% [markdown]
# {numref}`fig-ch07-orbit` draws the three quantities along the orbit: a parabola for
# $B_{\rm raw}$ whose minimum is $B_{\rm quot}$, and two flat lines.

# %%
orbit_contract = MeasurementContract(
    centre="the trained linear softmax classifier W (10 x 64), as stored",
    directions="common-row shift W + t 1 u^T, u the unit mean-row direction",
    normalisation="t in units of ||v100|| (t = 1 makes ||W||_F^2 100x larger)",
    radius="t in [-1.2, 1.2]", loss="n/a (proxies of softmax cross-entropy curvature)",
    reduction="mean over examples", data=f"{len(h_test)} held-out digits images (h = pixels / 16)",
    model_mode="n/a (no layers with state)", resolution="61 values of t", precision="float64",
)
ts = np.linspace(-1.2, 1.2, 61)
curves = {name: [float(f(sm.common_row_shift(W_lin, float(s) * v100), h_test)) for s in ts]
          for name, f in (("B_raw", sm.b_raw), ("B_quot", sm.b_quot), ("kappa_exact", sm.kappa_exact))}
fig, ax = plt.subplots()
for name, style in (("B_raw", "-"), ("B_quot", "--"), ("kappa_exact", ":")):
    ax.semilogy(ts, curves[name], style, label=name)
ax.set_xlabel("shift t (W + t v100 1^T direction)")
ax.set_ylabel("mean over test images")
ax.legend()
glue_figure("ch07-orbit", fig, orbit_contract,
    "B_raw along the common-row orbit of one trained classifier; B_quot and kappa_exact are constant")
ledger.add("S1", "P(p) is the one-hot covariance and the softmax Jacobian; Hessian P kron hh^T; kappa_exact <= B_raw",
           {"symbolic (K=3)": "exact (sympy)", "max rel. |autograd - P kron hh^T|": "<= 1e-12"})
ledger.add("S2", "Common-row shifts keep p and kappa_exact, B_raw unbounded, W_c the unique minimum-norm point, B_quot = inf B_raw",
           {"B_raw ratio at 100x shift": round(report.measure_ratio, 8), "max prob. gap": "<= 1e-12",
            "min_v B_raw / B_quot - 1": "<= 1e-8"})

# %% [markdown]
# ```{glue:figure} fig-ch07-orbit
# :name: fig-ch07-orbit
#
# {glue:text}`cap-ch07-orbit`
# ```
#
# ## Reference classes double the proxy on average
#
# A standard identification convention fixes one class $r$ as reference and sets its row
# to zero, $W^{(r)} = W_c - \mathbf{1} w_{c,r}^\top$. Same function, but since
# $\mathbf{1}^\top W_c = 0$,
#
# $$
# \frac{B_{\rm raw}(W^{(r)}, h)}{B_{\rm quot}(W_c, h)} = 1 + \frac{K \lVert w_{c,r}\rVert^2}{\lVert W_c\rVert_F^2},
# \qquad
# \frac1K \sum_{r=1}^K \frac{B_{\rm raw}(W^{(r)}, h)}{B_{\rm quot}(W_c, h)} = 2 .
# $$ (eq-ch07-reference)
#
# The proof is the same for each feature column, so sympy works with one column
# $a_1, \dots, a_K$ with $\sum_k a_k = 0$ and a *symbolic* number of classes $K$:

# %%
K, r, k = sp.symbols("K", integer=True, positive=True), sp.Symbol("r", integer=True), sp.Symbol("k", integer=True)
col, S = sp.IndexedBase("a"), sp.Symbol("S", positive=True)  # S = ||W_c||_F^2 = sum_r a_r^2
pull_constants = lambda e: e.replace(lambda x: isinstance(x, sp.Sum), sp.factor_terms)
shifted = pull_constants(sp.Sum((col[k] - col[r]) ** 2, (k, 1, K)).expand().doit())
shifted = shifted.subs(sp.Sum(col[k], (k, 1, K)), 0)  # the column of W_c sums to zero
assert sp.simplify(shifted - (sp.Sum(col[k] ** 2, (k, 1, K)) + K * col[r] ** 2)) == 0
mean_ratio = pull_constants(sp.Sum(1 + K * col[r] ** 2 / S, (r, 1, K)).expand().doit()) / K
mean_ratio = sp.simplify(mean_ratio.subs(sp.Sum(col[r] ** 2, (r, 1, K)), S))
assert mean_ratio == 2
display(Math(r"\sum_k (a_k - a_r)^2 = " + sp.latex(shifted) + r",\qquad \frac1K\sum_r\Big(1 + \frac{K a_r^2}{S}\Big) = " + sp.latex(mean_ratio)))


# %% [markdown]
# We apply the convention to each of the 10 classes of the linear model, with
# $B_{\rm raw}(W^{(r)})$ and $B_{\rm quot}(W_c)$ evaluated as test-set means:

# %%
def reference_ratios(W, h):
    base = sm.b_quot(sm.centre(W), h)
    return np.array([float(sm.b_raw(sm.reference_class(sm.centre(W), r_), h) / base) for r_ in range(W.shape[0])])


ratios_lin = reference_ratios(W_lin, h_test)
closed = np.array([float(sm.reference_ratio(W_lin, r_)) for r_ in range(10)])
assert np.max(np.abs(ratios_lin - closed)) <= 1e-12 and abs(ratios_lin.mean() - 2) <= 1e-12
print(f"ratios over the 10 reference classes: {fmt(ratios_lin.min(), 4)} to {fmt(ratios_lin.max(), 4)}, "
      f"mean {fmt(ratios_lin.mean(), 12)}")

# %% [markdown]
# The mean is 2 to rounding, as {eq}`eq-ch07-reference` says, whatever the classifier. The
# *range* is a property of how the class rows differ in length, and we collect it below on
# every trained checkpoint.
#
# ## What training stores
#
# Heavy-ball SGD never moves the mean row: the cross-entropy gradient in $W$ is
# $(p - e_y) h^\top$, whose rows sum to zero. So without weight decay the mean row is the
# one drawn at initialisation, while the centred part grows with training. Coupled weight
# decay $\lambda$ shrinks the mean row geometrically. Adam normalises each coordinate
# separately and breaks the zero row sum, so it can move the mean row either way. At an
# initialisation with i.i.d. entries of variance $\sigma^2$,
# $\mathbb{E}\lVert W_c\rVert_F^2 = \operatorname{Tr}(\Pi)\, d \sigma^2 = (K-1) d\sigma^2$
# against $\mathbb{E}\lVert W\rVert_F^2 = K d \sigma^2$:

# %%
trace_Pi = sp.Sum(1 - 1 / K, (k, 1, K)).doit()  # Tr(I - 11^T/K): each diagonal entry is 1 - 1/K
assert sp.simplify(trace_Pi - (K - 1)) == 0 and (sp.eye(4) - sp.ones(4, 4) / 4).trace() == 3
ratio_init = sp.simplify(K / trace_Pi)
display(Math(r"\frac{\mathbb{E}\lVert W\rVert_F^2}{\mathbb{E}\lVert W_c\rVert_F^2} = " + sp.latex(ratio_init)
             + r" = " + sp.latex(ratio_init.subs(K, 10)) + r" \approx " + fmt(float(ratio_init.subs(K, 10)), 4)
             + r"\ \text{ for } K = 10"))

# %% [markdown]
# So a freshly initialised 10-class head has a raw/quotient ratio near $10/9 \approx 1.111$
# and a mean-row share near $1/K = 10\%$, whatever the architecture below it. We now train
# and record the share $K\lVert\bar w\rVert^2/\lVert W\rVert_F^2$ and the ratio
# $B_{\rm raw}/B_{\rm quot} = 1/(1 - \text{share})$ (exact for every feature, because the
# factor $\lVert h\rVert^2(1 - \lVert p\rVert^2)$ is common). The models are the linear one
# and an MLP 64-64-10 with ReLU (its $h$ is the 64 hidden units), trained for 150 full-batch
# steps. For the MLP the sweep is over the initialisation scale (a multiple of PyTorch's
# default) and the weight decay; the linear model gets two initialisation scales; both
# also train with Adam (learning rate 0.01), the optimiser that moves the mean row:

# %%
SETTINGS = ([((64, 10), "sgd", 1.0, 0.0), ((64, 10), "sgd", 3.0, 0.0), ((64, 10), "adam", 1.0, 0.0)]
            + [((64, 64, 10), "sgd", s, w) for s in (0.3, 1.0, 3.0) for w in (0.0, 1e-2)]
            + [((64, 64, 10), "sgd", 1.0, 1e-3)] + [((64, 64, 10), "adam", 1.0, w) for w in (0.0, 1e-2)])
record = lambda step, q: (step, float(sm.mean_row_share(q["weight"])))


def run(sizes, opt, scale, wd, seed=0, steps=150):
    params = sm.init_classifier(sizes, seed=seed, init_scale=scale)
    lr = 0.1 if opt == "sgd" else 0.01
    return sm.train_classifier(params, x_train, y_train, steps=steps, lr=lr, weight_decay=wd,
                               optimizer=opt, record_every=10, record=record)


# %% [markdown]
# Each run takes a fraction of a second; we keep the trained parameters and the share
# history of all of them:

# %%
runs = {setting: run(*setting) for setting in SETTINGS}
rows = []
for (sizes, opt, scale, wd), (params, hist) in runs.items():
    acc = float((sm.classifier_logits(params, split.x_test).argmax(-1) == split.y_test).double().mean())
    share = hist[-1][1]
    rows.append((("linear" if len(sizes) == 2 else "MLP"), opt, scale, wd, hist[0][1], share, 1 / (1 - share), acc))
    print(f"{rows[-1][0]:>6} {opt:>4} init x{fmt(scale):<3} wd {fmt(wd):<5} share at init {fmt(100 * hist[0][1], 3):>5}% "
          f"-> stored {fmt(100 * share, 3):>7}%  B_raw/B_quot {fmt(1 / (1 - share), 5):<7} test acc {fmt(acc, 3)}")

# %% [markdown]
# The stored share is anything from a few thousandths of a percent to more than ten
# percent depending on the settings: it falls with training length because the centred
# part grows, rises with the initialisation scale because the frozen mean row is larger,
# is wiped out by weight decay, and under Adam without decay can even grow.
# {numref}`fig-ch07-decay` follows the ratio over training for the MLP at the default
# initialisation.

# %%
decay_contract = orbit_contract.with_(
    centre="the classifier W of a 64-64-10 ReLU MLP along training (init x1, seed 0)",
    directions="n/a (a norm ratio, no perturbation)", normalisation="B_raw/B_quot = ||W||_F^2/||W_c||_F^2 (feature-independent)",
    radius="n/a", reduction="exact for every feature and any average",
    data="600 training digits; full-batch training", resolution="every 10 of 150 steps",
)
fig, ax = plt.subplots()
for opt, wd, style in (("sgd", 0.0, "-"), ("sgd", 1e-3, "--"), ("sgd", 1e-2, "-."), ("adam", 0.0, ":"), ("adam", 1e-2, (0, (5, 1, 1, 1)))):
    steps_, shares = np.array(runs[((64, 64, 10), opt, 1.0, wd)][1]).T
    ax.plot(steps_, 1 / (1 - shares), ls=style, label=f"{opt}, weight decay {fmt(wd)}")
ax.axhspan(1.103, 1.118, color="grey", alpha=0.2, label="reported start, ResNet-18 CIFAR-10")
ax.axhline(10 / 9, color="k", lw=0.6)
ax.set_xlabel("training step")
ax.set_ylabel("B_raw / B_quot")
ax.legend(fontsize=8)
glue_figure("ch07-decay", fig, decay_contract,
    "Raw/quotient ratio of the last layer over training: weight decay drives it to 1; the black line is K/(K-1) = 10/9")

# %% [markdown]
# ```{glue:figure} fig-ch07-decay
# :name: fig-ch07-decay
#
# {glue:text}`cap-ch07-decay`
# ```
#
# Every run starts near $10/9$, inside the band reported for the start of five end-to-end
# ResNet-18 runs {cite}`opazo2026flatness`; weight decay drives the ratio to 1. We record
# S4 with the range over the SGD runs and the dependence on the settings:

# %%
sgd_shares = np.array([row[5] for row in rows if row[1] == "sgd"])
init_ratios = np.array([1 / (1 - row[4]) for row in rows])
adam_nodecay = max(row[5] for row in rows if row[1] == "adam" and row[3] == 0.0)
glue("ch07-share-min", Plain(fmt(100 * sgd_shares.min(), 2) + "%"), display=False)
glue("ch07-share-max", Plain(fmt(100 * sgd_shares.max(), 2) + "%"), display=False)
glue("ch07-adam-share", Plain(fmt(100 * adam_nodecay, 3) + "%"), display=False)
ledger.add("S4", "Trained classifiers as stored have a small mean-row share; weight decay drives B_raw/B_quot toward 1",
           {"stored share, SGD runs (%)": [100 * sgd_shares.min(), 100 * sgd_shares.max()],
            "stored share, Adam without decay (%)": 100 * adam_nodecay,
            "B_raw/B_quot at init": [init_ratios.min(), init_ratios.max()],
            "B_raw/B_quot after 150 steps with wd 1e-2": max(row[6] for row in rows if row[3] == 1e-2)},
           reported="1.93-2.36% share; ratio 1.103-1.118", status="holds at our scale",
           note="the share is set by init scale, training length, weight decay and optimiser, not by the predictor: "
                "SGD never moves the mean row, Adam without decay can keep or grow it; the starting ratio is near K/(K-1)")

# %% [markdown]
# The stored share ranges from {glue:text}`ch07-share-min` to {glue:text}`ch07-share-max`
# over the SGD runs, and Adam without decay stores {glue:text}`ch07-adam-share`. A stored
# share is therefore a record of how the classifier was trained, not a property of the
# predictor; the reported 1.93-2.36% of {cite:t}`opazo2026flatness` is one such record.
#
# ## Reference-class ratios on every checkpoint
#
# For each of the checkpoints above we apply all ten reference-class conventions
# ({numref}`fig-ch07-reference`):

# %%
ref = {setting: reference_ratios(params["weight"], sm.classifier_features(params, h_test)) for setting, (params, _) in runs.items()}
all_ratios = np.concatenate(list(ref.values()))
mean_dev = max(abs(rs.mean() - 2) for rs in ref.values())
assert mean_dev <= 1e-12
print(f"{len(all_ratios)} reference-class parameterisations of {len(ref)} checkpoints: ratios "
      f"{fmt(all_ratios.min(), 4)} to {fmt(all_ratios.max(), 4)}; every within-checkpoint mean is 2 to within 1e-12")

# %%
ref_contract = decay_contract.with_(
    centre="each trained checkpoint of the sweep, centred (W_c)", directions="reference-class shifts W_c - 1 w_c,r^T, r = 0..9",
    normalisation="B_raw(W^(r)) / B_quot(W_c)", reduction="mean over examples (numerator and denominator)",
    data=f"{len(h_test)} held-out digits images", resolution="10 reference classes per checkpoint",
)
fig, ax = plt.subplots()
for i, (setting, rs) in enumerate(ref.items()):
    ax.plot(np.full(len(rs), i), rs, "o", ms=3, color="C0" if setting[0] == (64, 10) else "C1")
    ax.plot([i - 0.3, i + 0.3], [rs.mean()] * 2, color="k", lw=1.2)
ax.axhspan(1.939, 2.045, color="grey", alpha=0.2, label="reported range (ResNet-18 CIFAR-10)")
ax.set_xlabel("checkpoint (blue: linear, orange: MLP; sweep order)")
ax.set_ylabel("B_raw(W^(r)) / B_quot(W_c)")
ax.legend(fontsize=8)
glue_figure("ch07-reference", fig, ref_contract,
    "Raw/quotient ratio for every reference class of every checkpoint; black bars are the within-checkpoint means, exactly 2")
ledger.add("S3", "B_raw(W^(r))/B_quot(W_c) = 1 + K||w_c,r||^2/||W_c||_F^2 and its mean over r is exactly 2",
           {"symbolic": "mean = 2 for general K (sympy)", "ratio range over checkpoints": [all_ratios.min(), all_ratios.max()],
            "largest |mean - 2|": "<= 1e-12"},
           reported="ratios 1.939-2.045 on trained image models", status="holds at our scale",
           note="the mean 2 is exact; the spread is wider than reported because class-row norms of small digits models vary more")

# %% [markdown]
# ```{glue:figure} fig-ch07-reference
# :name: fig-ch07-reference
#
# {glue:text}`cap-ch07-reference`
# ```
#
# ## How loose is the quotient bound?
#
# Quotienting repairs the gauge, not the looseness of the trace inequality. At uniform
# probabilities $P = (I - \mathbf{1}\mathbf{1}^\top/K)/K$, and since $\mathbf{1}^\top W_c = 0$
# the ratio $B_{\rm quot}/\kappa_{\rm exact}$ is exactly $K - 1$ (sympy, one column, general $K$):

# %%
tr_cov_uniform = 1 - K * (1 / K) ** 2
variance_uniform = pull_constants(sp.Sum(col[k] ** 2 / K, (k, 1, K))) - pull_constants(sp.Sum(col[k] / K, (k, 1, K))) ** 2
variance_uniform = variance_uniform.subs(sp.Sum(col[k], (k, 1, K)), 0)
loose_uniform = sp.simplify(sp.Sum(col[k] ** 2, (k, 1, K)) * tr_cov_uniform / variance_uniform)
assert sp.simplify(loose_uniform - (K - 1)) == 0
display(Math(r"\frac{B_{\rm quot}}{\kappa_{\rm exact}}\Big|_{p = \mathbf{1}/K} = " + sp.latex(loose_uniform)))


# %% [markdown]
# The looseness therefore grows with the number of classes. We measure it as the ratio
# of training-set means on every checkpoint above, and on MLPs trained with the same
# settings on 3- and 5-class subsets of the digits:

# %%
def looseness(params, x):
    h = sm.classifier_features(params, x)
    return float(sm.b_quot(params["weight"], h) / sm.kappa_exact(params["weight"], h))


loose10 = np.array([looseness(params, x_train) for params, _ in runs.values()])
loose_by_K = {10: loose10}
for classes in ((0, 1, 2), (0, 1, 2, 3, 4)):
    sub = data.digits(n_train=300, n_test=50, seed=0, classes=classes)
    trained, _ = sm.train_classifier(sm.init_classifier([64, 64, len(classes)], seed=0), sub.x_train, sub.y_train, steps=150, lr=0.1)
    loose_by_K[len(classes)] = np.array([looseness(trained, sub.x_train)])
for K_val, values in sorted(loose_by_K.items()):
    print(f"K = {K_val:>2}: B_quot / kappa_exact = {fmt(values.min(), 4)} to {fmt(values.max(), 4)}  (K - 1 = {K_val - 1})")
ledger.add("S14", "B_quot is far from tight: its ratio to kappa_exact on trained checkpoints",
           {"K=10 checkpoints": [loose10.min(), loose10.max()], "K=3": loose_by_K[3][0], "K=5": loose_by_K[5][0],
            "exact at uniform p": "K - 1 (sympy)"},
           reported="about 100x (102.95-108.44 on modular-arithmetic checkpoints)", status="differs",
           note="the ratio tracks K - 1: about 9 for our 10-class digits models; the reported ~100x comes from "
                "modular-arithmetic heads with about a hundred classes")

# %% [markdown]
# With ten classes $B_{\rm quot}$ overstates $\kappa_{\rm exact}$ about ninefold, close to
# $K - 1$, and the factor falls with $K$; the roughly hundredfold looseness reported on
# modular-arithmetic checkpoints is what $K - 1$ predicts for heads with about a hundred
# classes. So S14 is reproduced in kind but not in size, for a reason we can name.
#
# ## What this establishes
#
# $\kappa_{\rm exact}$ and $B_{\rm quot}$ are functions of the predictor (for this
# symmetry): their values and gradients are the same at every representative of a
# classifier's orbit. $B_{\rm raw}$ is a function of the representative: it is unbounded
# along the orbit, doubles on average under reference-class conventions, and in trained
# models as stored carries a mean-row share that records the initialisation, the weight
# decay, the optimiser and the training length. None of this says $B_{\rm quot}$ is a good
# measure of flatness: it is still a loose trace bound, by about $K - 1$. The next chapter
# turns from the gauge to a separate question: whether such a bound can certify robustness
# at all.
#
# ## Results ledger

# %%
ledger
