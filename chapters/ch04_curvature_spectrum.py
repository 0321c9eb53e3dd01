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
# (ch-curvature-spectrum)=
# # Curvature is a spectrum
#
# "The Hessian at this minimum is small" compresses $n$ eigenvalues into one word. Which
# eigenvalue, of which matrix, counted how? This chapter computes the whole spectrum of a
# small ReLU network trained on handwritten digits, exactly (a dense float64 Hessian)
# and iteratively (Hessian-vector products, Lanczos, Hutchinson's trace estimator,
# stochastic Lanczos quadrature), and asks what each summary statistic answers. Then it
# counts the exact zero eigenvalues and finds every one of them predicted, most by a
# symmetry of the model and the rest by the rank of the data each hidden unit sees. Finally it puts the Hessian beside
# the two matrices often used in its place, the generalised Gauss-Newton matrix and the
# Fisher information, and shows where they agree and where they do not.
#
# **Claims established here:** M2, M3, M4.
#
# We load the tools once. Every matrix here is small (under a thousand rows), so we pin
# the linear-algebra libraries to one thread: that is faster for matrices of this size on
# a shared machine and keeps the last digits of every eigenvalue reproducible.

# %%
import numpy as np
import sympy as sp
import torch
import matplotlib.pyplot as plt
from IPython.display import Math, display
from myst_nb import glue
from threadpoolctl import threadpool_limits

from lossgeom import curvature as cv
from lossgeom import product
from lossgeom.contract import MeasurementContract
from lossgeom.curvature import flatten_params
from lossgeom.data import digits
from lossgeom.display import fmt, glue_figure, use_book_style
from lossgeom.ledger import Ledger
from lossgeom.models import loss_closure, mlp, params_of
from lossgeom.optimisers import indexed_loss, sgd, train
from lossgeom.symmetries import relu_neuron_rescaling

torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)
threadpool_limits(limits=1)
use_book_style()
ledger = Ledger("Chapter 4: curvature is a spectrum")

# %% [markdown]
# ## A network small enough to diagonalise
#
# We take 1,000 training images of sklearn's 8x8 digits. Four pixels are zero in every
# training image; a weight reading such a pixel can never change the loss, so it would add
# a zero eigenvalue that says nothing about the model. We drop those pixels up front:

# %%
split = digits(n_train=1000, n_test=500, seed=0)
informative = split.x_train.std(dim=0) > 0
x, y = split.x_train[:, informative], split.y_train
x_test, y_test = split.x_test[:, informative], split.y_test
d, K, width = x.shape[1], 10, 12
print(f"{split.description}; {64 - d} constant pixels dropped, d = {d} inputs")

# %% [markdown]
# The network is a one-hidden-layer ReLU MLP, $f(x) = W_2\, \mathrm{relu}(W_1 x + b_1) + b_2$,
# with 12 hidden units and the mean cross-entropy loss. We train it by full-batch gradient
# descent from a seeded initialisation:

# %%
STEPS, LR, SEED = 200, 0.5, 1
model = mlp([d, width, K], activation="relu", seed=SEED)
loss_fn = loss_closure(model, x, y)
params = train(indexed_loss(model, x, y), params_of(model), sgd(LR), STEPS).params  # full-batch GD
n_params = sum(p.numel() for p in params.values())


# %% [markdown]
# We record where training stopped: the loss, the gradient norm (not zero: this is not a
# critical point, which matters below) and the test accuracy:

# %%
def accuracy(p, inputs, labels):
    with torch.no_grad():
        return float((torch.func.functional_call(model, p, (inputs,)).argmax(1) == labels).double().mean())


grad_norm = float(cv.dense_gradient(loss_fn, params).norm())
print(f"{n_params} parameters; training loss {fmt(float(loss_fn(params)), 6)}, gradient norm {fmt(grad_norm, 4)}, "
      f"train accuracy {fmt(accuracy(params, x, y), 4)}, test accuracy {fmt(accuracy(params, x_test, y_test), 4)}")
glue("ch04-nparams", n_params, display=False)
glue("ch04-gradnorm", grad_norm, display=False)

# %% [markdown]
# With {glue:text}`ch04-nparams` parameters the dense Hessian (`lossgeom.curvature.dense_hessian`,
# `torch.func.hessian` in float64) and its full eigendecomposition are cheap. They are the
# reference every iterative estimate below is checked against:

# %%
H = cv.dense_hessian(loss_fn, params).numpy()
eigs, eigvecs = np.linalg.eigh(H)
assert np.abs(H - H.T).max() <= 1e-14 * np.abs(H).max()
print(f"Hessian {H.shape[0]} x {H.shape[1]}, symmetric; eigenvalues from {fmt(eigs[0], 6)} to {fmt(eigs[-1], 6)}")

# %% [markdown]
# ## Matrix-free curvature
#
# At scale nobody forms $H$. What one can afford is a Hessian-vector product (HVP),
# $Hv = \frac{d}{dt}\nabla L(\theta + t v)\big|_{t=0}$, which `lossgeom.curvature.hessian_operator`
# computes by forward-mode differentiation of the reverse-mode gradient
# (`torch.func.jvp` of `torch.func.grad`) and wraps as a `scipy.sparse.linalg.LinearOperator`
# that counts its products. A Taylor expansion checks it without any reference: along a
# direction $u$ the remainder of the second-order model must shrink as $t^3$, that of the
# first-order model as $t^2$. The ReLU kinks spoil third-order behaviour, so the check
# uses the same architecture with a smooth activation:

# %%
smooth = mlp([d, width, K], activation="tanh", seed=SEED)
smooth_loss = loss_closure(smooth, x, y)
direction = np.random.default_rng(0).standard_normal(n_params)
steps_t = np.geomspace(1e-3, 1e-1, 6)
r1, r2 = cv.taylor_remainders(smooth_loss, params_of(smooth), direction / np.linalg.norm(direction), steps_t)
slope1, slope2 = (np.polyfit(np.log(steps_t), np.log(r), 1)[0] for r in (r1, r2))
assert abs(slope1 - 2) < 0.1 and abs(slope2 - 3) < 0.15
print(f"log-log slopes of the Taylor remainders: first order {fmt(slope1, 3)}, second order (uses the HVP) {fmt(slope2, 3)}")

# %% [markdown]
# The slopes are 2 and 3, as they must be if the gradient and the HVP are right. On the
# ReLU network we compare the operator with the dense matrix directly, and with the
# Hessian operator of curvlinops {cite}`dangel2025curvlinops` (which multiplies by the
# same matrix through its own `torch.func` code):

# %%
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # curvlinops' dependency uses torch.jit.script
    import curvlinops

H_op = cv.hessian_operator(loss_fn, params)
probe = np.random.default_rng(1).standard_normal((n_params, 3))
with torch.no_grad():
    for name, p in model.named_parameters():
        p.copy_(params[name])
H_curvlinops = curvlinops.HessianLinearOperator(model, torch.nn.CrossEntropyLoss(), list(model.parameters()), [(x, y)])
err_dense = np.abs(H_op @ probe - H @ probe).max() / np.abs(H @ probe).max()
err_curvlinops = np.abs(H_op @ probe - H_curvlinops.to_scipy() @ probe).max() / np.abs(H @ probe).max()
assert err_dense <= 1e-12 and err_curvlinops <= 1e-12
print(f"3 random HVPs: relative error vs dense {'<= 1e-12'}, vs curvlinops {'<= 1e-12'}; products counted: {H_op.n_hvp}")

# %% [markdown]
# Both agree to rounding.
#
# ## Five numbers from one spectrum
#
# The extreme eigenvalues come from Lanczos iteration (`lossgeom.curvature.top_eigenpairs`
# calls ARPACK's implicitly restarted Lanczos through `scipy.sparse.linalg.eigsh`). The
# largest eigenvalue converges in a few dozen HVPs:

# %%
top = cv.top_eigenpairs(H_op, k=1, which="largest", tol=1e-10, seed=0)
rel_top = abs(top.values[0] - eigs[-1]) / eigs[-1]
assert rel_top <= 1e-10 and top.residuals[0] <= 1e-8 * eigs[-1]
print(f"largest eigenvalue {fmt(top.values[0], 8)} after {top.n_hvp} HVPs (dense: {fmt(eigs[-1], 8)})")

# %% [markdown]
# The most negative one is much harder: it sits at the edge of a dense cluster of small
# eigenvalues of both signs, and the Krylov space needs to resolve that cluster. The count
# of products depends only on the Krylov process, not on how a product is computed, so we
# let Lanczos multiply by the stored dense matrix (faster at this size) and read off the
# count:

# %%
bottom = cv.top_eigenpairs(H, k=1, which="smallest", tol=1e-8, seed=0)
assert abs(bottom.values[0] - eigs[0]) <= 1e-8 * abs(eigs[0]) and bottom.n_hvp > n_params
print(f"most negative eigenvalue {fmt(bottom.values[0], 6)} after {bottom.n_hvp} products "
      f"(dense: {fmt(eigs[0], 6)}; n = {n_params})")
glue("ch04-bottom-hvp", bottom.n_hvp, display=False)

# %% [markdown]
# That is {glue:text}`ch04-bottom-hvp` products, more than the {glue:text}`ch04-nparams`
# columns of the matrix: for the bottom of this spectrum, the dense Hessian is the cheaper
# computation. The trace is estimated by Hutchinson's estimator
# {cite}`hutchinson1990stochastic`, $\operatorname{tr} H \approx \frac1m \sum_j z_j^\top H z_j$
# with Rademacher $z_j$, which reports a standard error, and by Hutch++
# {cite}`meyer2021hutch`, which first removes a sketched top subspace:

# %%
trace_exact = float(eigs.sum())
hutch = cv.hutchinson_trace(H_op, n_probes=60, seed=0)
hutchpp = cv.hutchpp_trace(H_op, n_hvp=60, seed=0)
assert abs(hutch.estimate - trace_exact) <= 4 * hutch.std_error
assert abs(hutchpp.estimate - trace_exact) <= 4 * hutchpp.std_error and hutchpp.std_error < hutch.std_error
for name, est in (("Hutchinson", hutch), ("Hutch++", hutchpp)):
    print(f"{name:10s}: {fmt(est.estimate, 5)} +- {fmt(est.std_error, 2)} ({est.n_hvp} HVPs); exact {fmt(trace_exact, 6)}")

# %% [markdown]
# At an equal budget of 60 HVPs the Hutch++ standard error is the smaller one, because a
# few large eigenvalues carry most of the trace and the sketch captures them exactly.
#
# Now the statistics themselves. `lossgeom.curvature.spectrum_summary` reads them off the
# full spectrum. The condition number needs a convention, because the spectrum contains
# zeros and negative values: we take the largest eigenvalue over the smallest eigenvalue
# *above* a threshold $\tau\,\lambda_{\max}$, and sweep $\tau$:

# %%
taus = [1e-2, 1e-4, 1e-6, 1e-8, 1e-10]
summaries = {tau: cv.spectrum_summary(eigs, rel_threshold=tau) for tau in taus}
s6 = summaries[1e-6]
assert all(0.5 / tau <= s.condition_number <= 1 / tau for tau, s in summaries.items())
print(f"largest {fmt(s6.largest, 6)}, most negative {fmt(s6.most_negative, 4)}, trace {fmt(s6.trace, 6)}")
for tau, s in summaries.items():
    print(f"tau = {fmt(tau)}: condition number {fmt(s.condition_number, 3)}, "
          f"{s.n_negative} eigenvalues below -tau lambda_max (sum {fmt(s.negative_mass, 4)}), {s.n_near_zero} with |lambda| <= tau lambda_max")

# %% [markdown]
# The restricted condition number stays between $0.5/\tau$ and $1/\tau$ for every $\tau$: it measures the threshold,
# not the network, because the positive spectrum reaches continuously down to zero. The
# trace is positive and large, yet there are negative directions:

# %%
n_neg = int(np.sum(eigs < -1e-8 * eigs[-1]))
neg_share = -float(eigs[eigs < 0].sum()) / trace_exact
assert trace_exact > 0 and eigs[0] < 0 and n_neg > 0
glue("ch04-trace", trace_exact, display=False)
glue("ch04-nneg", n_neg, display=False)
glue("ch04-negshare", 100 * neg_share, display=False)
glue("ch04-lammin", float(eigs[0]), display=False)
glue("ch04-lammax", float(eigs[-1]), display=False)
glue("ch04-near-zero-pct", 100 * summaries[1e-6].n_near_zero / n_params, display=False)
print(f"{n_neg} eigenvalues below -1e-8 lambda_max; all negative eigenvalues together are {fmt(100 * neg_share, 3)}% of the trace")

# %% [markdown]
# The trace {glue:text}`ch04-trace:.4g` hides {glue:text}`ch04-nneg` negative
# eigenvalues, whose total is only {glue:text}`ch04-negshare:.2g`% of it. The product
# model of {numref}`Chapter %s <ch-family-of-minima>` shows the same thing in closed form.
# Just past the orbit, at $(a, b) = (6/5, 6/5)$, the trace $a^2 + b^2$ is positive while
# one eigenvalue is negative:

# %%
a, b = sp.symbols("a b", real=True)
L_prod = sp.Rational(1, 2) * (a * b - 1) ** 2
H_prod = sp.hessian(L_prod, [a, b]).subs({a: sp.Rational(6, 5), b: sp.Rational(6, 5)})
ev_prod = sorted(H_prod.eigenvals(), key=float)
assert H_prod.trace() > 0 and ev_prod[0] < 0 and sp.simplify(sum(ev_prod) - H_prod.trace()) == 0
assert np.allclose(np.linalg.eigvalsh(product.hessian(1.2, 1.2)), [float(e) for e in ev_prod], rtol=1e-14)
display(Math(r"\nabla^2 L(6/5, 6/5) = " + sp.latex(H_prod) + r",\quad \operatorname{spec} = \{"
             + ", ".join(sp.latex(e) for e in ev_prod) + r"\},\quad \operatorname{tr} = " + sp.latex(H_prod.trace())))

# %% [markdown]
# The largest eigenvalue answers "how fast can gradient descent go", the most negative
# "is this a minimum", the trace "how much curvature in total, signs cancelling", and the
# condition number "how different are the sharp and the shallow directions", and that last
# one only after a threshold is chosen. None of these answers the others.
#
# The whole spectrum can be seen at once as a density. Stochastic Lanczos quadrature
# {cite}`ghorbani2019investigation` runs a short Lanczos process from each random probe
# and turns it into a quadrature rule for $\frac1n\sum_i \delta(x - \lambda_i)$; we
# broaden both the estimate and the exact eigenvalues with the same Gaussian:

# %%
SIGMA, N_PROBES, N_LANCZOS = 0.02, 4, 40
grid = np.linspace(eigs[0] - 0.1, eigs[-1] + 0.1, 800)
slq = cv.spectral_density(H_op, grid, n_probes=N_PROBES, n_lanczos=N_LANCZOS, sigma=SIGMA, seed=0)
exact_density = cv.dense_spectral_density(eigs, grid, SIGMA)
density_err = np.abs(slq.density - exact_density).max() / exact_density.max()
assert density_err <= 0.05 and abs(np.trapezoid(slq.density, grid) - 1) <= 1e-6
print(f"SLQ with {N_PROBES} probes x {N_LANCZOS} Lanczos steps ({slq.n_hvp} HVPs): "
      f"largest deviation from the exact smoothed density {fmt(100 * density_err, 2)}% of its peak")

# %%
density_contract = MeasurementContract(
    centre=f"the trained MLP ({STEPS} full-batch GD steps, lr {LR}, seed {SEED})",
    directions="all of parameter space (full Hessian spectrum)",
    normalisation="raw parameter coordinates of torch.nn.Linear layers",
    radius="n/a (second derivative at the point)", loss="cross-entropy", reduction="mean over the training set",
    data=f"{split.description}; {d} non-constant pixels", model_mode="n/a (no dropout or batch norm)",
    resolution=f"{len(grid)} grid points; SLQ {N_PROBES} Rademacher probes x {N_LANCZOS} Lanczos steps, seed 0; Gaussian broadening sigma = {SIGMA}",
    precision="float64",
)
fig, ax = plt.subplots()
ax.semilogy(grid, exact_density, label="exact eigenvalues, broadened")
ax.semilogy(grid, slq.density, "--", label=f"SLQ estimate ({slq.n_hvp} HVPs)")
ax.set_ylim(1e-4, 3 * exact_density.max())
ax.set_xlabel(r"eigenvalue $\lambda$")
ax.set_ylabel("spectral density")
ax.legend()
glue_figure("ch04-density", fig, density_contract,
    "Hessian spectral density of the trained digits MLP: a bulk at zero and a few outliers")

# %% [markdown]
# ```{glue:figure} fig-ch04-density
# :name: fig-ch04-density
#
# {glue:text}`cap-ch04-density`
# ```
#
# {numref}`fig-ch04-density` shows the shape reported for larger networks by
# {cite:t}`ghorbani2019investigation`: a bulk concentrated at zero and a handful of
# isolated outliers, here up to {glue:text}`ch04-lammax:.4g`. The negative eigenvalues,
# down to {glue:text}`ch04-lammin:.2g`, are invisible on this scale.

# %%
ledger.add("M2", "Spectrum statistics answer different questions; the trace can hide negative directions",
           {"lambda_max": float(eigs[-1]), "lambda_min": float(eigs[0]), "trace": trace_exact,
            "negative eigenvalues": n_neg, "negative share of trace (%)": 100 * neg_share,
            "condition number at tau=1e-4 / 1e-8": [summaries[1e-4].condition_number, summaries[1e-8].condition_number],
            "product model (6/5,6/5)": f"spec {{{', '.join(str(e) for e in ev_prod)}}}, trace {H_prod.trace()}"})

# %% [markdown]
# ## Zero eigenvalues from symmetries
#
# In {numref}`fig-ch04-density`, {glue:text}`ch04-near-zero-pct:.2g`% of all eigenvalues lie
# within $10^{-6}\lambda_{\max}$ of zero. Some zeros are forced by the model's symmetries. Let $\varphi_s$ be a
# one-parameter group of parameter maps that leaves the loss unchanged,
# $L(\varphi_s(\theta)) = L(\theta)$ for all $\theta$ and $s$, with tangent
# $t(\theta) = \partial_s \varphi_s(\theta)|_{s=0}$. Differentiating once in $s$ gives
# $\nabla L^\top t = 0$: **the gradient is orthogonal to the orbit everywhere**.
# Differentiating that identity in $\theta$ gives
#
# $$
# H(\theta)\, t(\theta) = -\,Dt(\theta)^\top \nabla L(\theta) .
# $$ (eq-ch04-kernel)
#
# For a *translation* ($t$ constant, $Dt = 0$) the tangent is a null vector of the
# Hessian at every point. For a *scaling* ($t = A\theta$ with a fixed matrix $A$) it is a
# null vector only where the gradient vanishes, at a critical point.
#
# Two symmetries act on our network. ReLU is positively homogeneous,
# $\mathrm{relu}(cz) = c\,\mathrm{relu}(z)$ for $c > 0$, so multiplying hidden unit $j$'s
# incoming weights and bias by $c_j$ and dividing its outgoing weights by $c_j$ changes
# nothing: one scaling per hidden unit. And softmax only sees differences of logits, so
# adding the same vector $v^\top$ to every row of $W_2$ and the same number $s$ to every
# entry of $b_2$ changes nothing: $\text{width} + 1$ translations. We let sympy confirm
# the homogeneity (writing $\mathrm{relu}(z) = (z + |z|)/2$), then the kernel identity
# {eq}`eq-ch04-kernel` for one ReLU unit on two examples, in the region where it is active:

# %%
z = sp.symbols("z", real=True)
c = sp.symbols("c", positive=True)
relu = lambda u: (u + sp.Abs(u)) / 2
assert sp.simplify(relu(c * z) - c * relu(z)) == 0

w, bias, v = sp.symbols("w b v", real=True)
x1, x2, y1, y2 = sp.symbols("x_1 x_2 y_1 y_2", real=True)
L_unit = sum(sp.Rational(1, 2) * (v * (w * xi + bias) - yi) ** 2 for xi, yi in ((x1, y1), (x2, y2)))
theta = [w, bias, v]
g_unit = sp.Matrix([sp.diff(L_unit, q) for q in theta])
H_unit = sp.hessian(L_unit, theta)
A = sp.diag(1, 1, -1)
t_unit = A * sp.Matrix(theta)
assert sp.simplify(g_unit.dot(t_unit)) == 0
assert sp.simplify(H_unit * t_unit + A.T * g_unit) == sp.zeros(3, 1)
display(Math(r"t = A\theta = " + sp.latex(t_unit.T) + r",\qquad \nabla L^\top t = 0,\qquad H t = -A^\top \nabla L"))

# %% [markdown]
# For the softmax shift we take a linear classifier with $K = 3$ classes and $d = 2$
# inputs. The loss is exactly invariant under the shift, and the Hessian of the
# cross-entropy with respect to the logits, $\operatorname{diag}(p) - p p^\top$, has the
# all-ones vector as its only null direction when every $p_k > 0$:

# %%
Ks, ds = 3, 2
Wsym = sp.Matrix(Ks, ds, lambda i, j: sp.Symbol(f"W_{i}{j}", real=True))
bsym = sp.Matrix(Ks, 1, lambda i, j: sp.Symbol(f"b_{i}", real=True))
xsym = sp.Matrix(ds, 1, lambda i, j: sp.Symbol(f"x_{i}", real=True))
usym = sp.Matrix(ds, 1, lambda i, j: sp.Symbol(f"v_{i}", real=True))
s = sp.Symbol("s", real=True)
cross_entropy = lambda logits: -logits[0] + sp.log(sum(sp.exp(l) for l in logits))
shifted = (Wsym + sp.ones(Ks, 1) * usym.T) * xsym + bsym + s * sp.ones(Ks, 1)
assert sp.simplify(cross_entropy(shifted) - cross_entropy(Wsym * xsym + bsym)) == 0
p1, p2 = sp.symbols("p_1 p_2", positive=True)
p = sp.Matrix([p1, p2, 1 - p1 - p2])
null_logits = (sp.diag(*p) - p * p.T).nullspace()
assert len(null_logits) == 1 and sp.simplify(null_logits[0] - sp.ones(3, 1)) == sp.zeros(3, 1)
display(Math(r"\ker\big(\operatorname{diag}(p) - pp^\top\big) = \operatorname{span}" + sp.latex(null_logits[0].T)))

# %% [markdown]
# So a linear softmax classifier $W \in \mathbb{R}^{K \times d}$, $b \in \mathbb{R}^K$ has
# at least $d + 1$ null directions at every point, and exactly $d + 1$ when the inputs
# $(x_i, 1)$ span $\mathbb{R}^{d+1}$. We train one on the same digits and count:

# %%
linear = mlp([d, K], seed=0)
linear_loss = loss_closure(linear, x, y)
lin_params = train(indexed_loss(linear, x, y), params_of(linear), sgd(LR), STEPS).params
H_lin = cv.dense_hessian(linear_loss, lin_params).numpy()
eigs_lin = np.linalg.eigvalsh(H_lin)
x_aug = torch.cat([x, torch.ones(len(x), 1)], dim=1)
assert int(torch.linalg.matrix_rank(x_aug)) == d + 1


# %% [markdown]
# We count eigenvalues with $|\lambda| \le \tau \lambda_{\max}$ for the same sweep of
# $\tau$ as before, and look at the gap between the last counted and the first uncounted
# one:

# %%
def null_counts(eigenvalues, taus):
    rel = np.sort(np.abs(eigenvalues)) / eigenvalues.max()
    return {tau: int(np.sum(rel <= tau)) for tau in taus}, rel


counts_lin, rel_lin = null_counts(eigs_lin, [1e-14, 1e-12, 1e-10, 1e-8, 1e-6])
predicted_lin = d + 1
assert counts_lin[1e-12] == predicted_lin and rel_lin[predicted_lin - 1] <= 1e-14 and rel_lin[predicted_lin] >= 1e-12
print(f"linear softmax, {H_lin.shape[0]} parameters, loss {fmt(float(linear_loss(lin_params)), 5)}: predicted d + 1 = {predicted_lin}")
print("counts by tau:", ", ".join(f"{fmt(t)}: {n}" for t, n in counts_lin.items()))
print(f"gap: eigenvalue {predicted_lin} is <= 1e-14 lambda_max, eigenvalue {predicted_lin + 1} is {fmt(rel_lin[predicted_lin], 2)} lambda_max")
glue("ch04-lin-pred", predicted_lin, display=False)
glue("ch04-lin-gap", float(rel_lin[predicted_lin]), display=False)


# %% [markdown]
# Exactly {glue:text}`ch04-lin-pred` eigenvalues sit at rounding level, and the next one
# is {glue:text}`ch04-lin-gap:.2g` $\lambda_{\max}$, many orders of magnitude above. The
# count is stable from $\tau = 10^{-14}$ to $10^{-10}$ and then starts to include genuine
# small curvature. The model was not trained to a critical point, and it did not need to
# be: a translation's tangent is in the kernel everywhere.
#
# In the network, we build the tangents explicitly: the rescaling tangents by
# differentiating `lossgeom.symmetries.relu_neuron_rescaling` with respect to one scale at
# $c = 1$ (`torch.func.jvp`), the shift tangents directly:

# %%
def rescaling_tangent(j):
    def moved(cj):
        scales = torch.ones(width) + (cj - 1) * torch.eye(width)[j]
        return flatten_params(relu_neuron_rescaling("0", "2", scales)(params))[0]
    return torch.func.jvp(moved, (torch.tensor(1.0),), (torch.tensor(1.0),))[1].numpy()


def shift_tangent(row_shift, bias_shift):
    tangent = {name: torch.zeros_like(p) for name, p in params.items()}
    tangent["2.weight"] = torch.ones(K, 1) * row_shift[None, :]
    tangent["2.bias"] = bias_shift * torch.ones(K)
    return flatten_params(tangent)[0].numpy()


def unit_signs(j):
    signs = {name: torch.zeros_like(p) for name, p in params.items()}
    signs["0.weight"][j], signs["0.bias"][j], signs["2.weight"][:, j] = 1.0, 1.0, -1.0
    return flatten_params(signs)[0].numpy()


# %% [markdown]
# The identity {eq}`eq-ch04-kernel` predicts three things at our non-critical point: the
# gradient is orthogonal to all tangents; the shift tangents are exact null vectors; the
# rescaling tangents are not, and $H t_j = -A_j \nabla L$ exactly, where $A_j$ is $+1$ on
# unit $j$'s incoming weights and bias, $-1$ on its outgoing weights:

# %%
T_rescale = np.stack([rescaling_tangent(j) for j in range(width)], axis=1)
T_shift = np.stack([shift_tangent(torch.eye(width)[i], 0.0) for i in range(width)]
                   + [shift_tangent(torch.zeros(width), 1.0)], axis=1)
gradient = cv.dense_gradient(loss_fn, params).numpy()
A_diag = np.stack([unit_signs(j) for j in range(width)], axis=1)  # the diagonal of A_j, column j
kernel_err = np.abs(H @ T_rescale + A_diag * gradient[:, None]).max() / np.abs(H @ T_rescale).max()
orth = np.abs(gradient @ np.concatenate([T_rescale, T_shift], axis=1)).max() / np.linalg.norm(gradient)
shift_null = np.abs(H @ T_shift).max() / eigs[-1]
rescale_size = np.linalg.norm(H @ T_rescale, axis=0) / np.linalg.norm(T_rescale, axis=0)
assert orth <= 1e-12 and shift_null <= 1e-13 and kernel_err <= 1e-10
print(f"|grad . t| / |grad| <= 1e-12 for all {T_rescale.shape[1] + T_shift.shape[1]} tangents; "
      f"|H T_shift| / lambda_max <= 1e-13; H t_j = -A_j grad to relative {'<= 1e-10'}")
print(f"|H t_j| / |t_j| for the rescalings: {fmt(rescale_size.min(), 3)} to {fmt(rescale_size.max(), 3)}")

# %% [markdown]
# The three predictions hold. The rescaling directions carry curvature of the size of the
# gradient, so at this point only the {glue:text}`ch04-shift-dim` shift directions are
# forced zeros. There is one more source of exact zeros that no symmetry predicts: unit
# $j$ only sees the inputs on which it is active, and if those $(x_i, 1)$ span fewer than
# $d + 1$ dimensions, the missing ones are flat. We count those from the data, and add
# them to the prediction:

# %%
with torch.no_grad():
    active = (x @ params["0.weight"].T + params["0.bias"]) > 0
assert min(int(active[:, j].sum()) for j in range(width)) > 0  # no dead unit at this seed


def data_null_directions(j):
    """Directions of unit j's incoming weights and bias that no active input can see."""
    _, sing, vt = np.linalg.svd(x_aug[active[:, j]].numpy())
    rank = int(np.sum(sing > 1e-10 * sing[0]))
    directions = []
    for row in vt[rank:]:
        tangent = {name: torch.zeros_like(p) for name, p in params.items()}
        tangent["0.weight"][j], tangent["0.bias"][j] = torch.from_numpy(row[:d]), float(row[d])
        directions.append(flatten_params(tangent)[0].numpy())
    return directions


T_data = np.stack([t for j in range(width) for t in data_null_directions(j)], axis=1)
data_null = T_data.shape[1]
predicted_H = (width + 1) + data_null
assert np.abs(H @ T_data).max() <= 1e-13 * eigs[-1]
counts_H, rel_H = null_counts(eigs, [1e-14, 1e-12, 1e-10, 1e-8, 1e-6])
assert counts_H[1e-14] == predicted_H and rel_H[predicted_H - 1] <= 1e-15 and rel_H[predicted_H] >= 1e-14
glue("ch04-shift-dim", width + 1, display=False)
glue("ch04-data-null", data_null, display=False)
glue("ch04-pred-H", predicted_H, display=False)
glue("ch04-H-gap", float(rel_H[predicted_H]), display=False)
print(f"data-degenerate directions (rank-deficient active inputs): {data_null}, all null for H to 1e-13 lambda_max")
print(f"predicted exact zeros: {width + 1} (shift) + {data_null} (data) = {predicted_H}")
print("counts by tau:", ", ".join(f"{fmt(t)}: {n}" for t, n in counts_H.items()))
print(f"gap: eigenvalue {predicted_H} is <= 1e-15 lambda_max, eigenvalue {predicted_H + 1} is {fmt(rel_H[predicted_H], 2)} lambda_max")

# %% [markdown]
# The Hessian has exactly {glue:text}`ch04-pred-H` eigenvalues at rounding level:
# {glue:text}`ch04-shift-dim` from the softmax shift and {glue:text}`ch04-data-null`
# from units whose active inputs are rank-deficient, with a gap up to
# {glue:text}`ch04-H-gap:.2g` $\lambda_{\max}$ after them. The {glue:text}`ch04-width` rescaling
# directions would join them at a critical point. Where to put a threshold above that is
# a choice: the counts at $\tau = 10^{-8}$ or $10^{-6}$ include many small but genuine
# curvatures, and calling them "flat directions of a basin" would mix three mechanisms
# with nothing in common.

# %%
glue("ch04-width", width, display=False)
null_contract = density_contract.with_(
    directions="all of parameter space (full spectra, sorted by |lambda|)",
    resolution="every eigenvalue (numpy.linalg.eigvalsh of the dense float64 matrices)",
    centre=f"the trained MLP ({STEPS} GD steps) and the trained linear softmax classifier ({STEPS} GD steps)",
)
fig, ax = plt.subplots()
shown = 120
ax.semilogy(np.arange(1, shown + 1), np.maximum(rel_H[:shown], 1e-22), ".", ms=3, label=f"ReLU MLP Hessian (n = {n_params})")
ax.semilogy(np.arange(1, shown + 1), np.maximum(rel_lin[:shown], 1e-22), ".", ms=3, label=f"linear softmax Hessian (n = {H_lin.shape[0]})")
ax.axvline(predicted_H + 0.5, color="C0", lw=0.8, ls="--", label=f"predicted zeros, MLP: {predicted_H}")
ax.axvline(predicted_lin + 0.5, color="C1", lw=0.8, ls="--", label=f"predicted zeros, linear: {predicted_lin}")
ax.set_xlabel(r"rank of $|\lambda|$ (smallest first)")
ax.set_ylabel(r"$|\lambda| / \lambda_{\max}$ (floored at 1e-22)")
ax.legend(fontsize=8)
glue_figure("ch04-zeros", fig, null_contract,
    "The smallest |eigenvalues| relative to the largest; dashed lines mark the counts predicted by symmetry plus data rank")

# %% [markdown]
# ```{glue:figure} fig-ch04-zeros
# :name: fig-ch04-zeros
#
# {glue:text}`cap-ch04-zeros`
# ```
#
# In {numref}`fig-ch04-zeros` each predicted count ends exactly where the spectrum jumps
# from rounding level to real curvature.
#
# The generalised Gauss-Newton matrix of the next section sees no gradient term, so in it
# the rescaling directions are exact zeros too: the network's outputs do not move along
# them at all. We check that the whole predicted subspace (rescaling, shift and data
# directions) is null for it, and count:

# %%
G = cv.dense_ggn(model, params, x, y).numpy()
eigs_G = np.linalg.eigvalsh(G)
basis, _ = np.linalg.qr(np.concatenate([T_rescale, T_shift, T_data], axis=1))
predicted_G = width + predicted_H
assert basis.shape[1] == predicted_G and np.linalg.matrix_rank(basis) == predicted_G
ggn_residual = np.linalg.norm(G @ basis, 2) / eigs_G[-1]
counts_G, rel_G = null_counts(eigs_G, [1e-14, 1e-12, 1e-10])
assert ggn_residual <= 1e-14 and counts_G[1e-14] >= predicted_G
print(f"predicted GGN null space: {width} + {predicted_H} = {predicted_G} dimensions; ||G Q|| / lambda_max <= 1e-14")
print("GGN counts by tau:", ", ".join(f"{fmt(t)}: {n}" for t, n in counts_G.items()))
glue("ch04-pred-G", predicted_G, display=False)
glue("ch04-count-G", counts_G[1e-14], display=False)

# %% [markdown]
# The predicted {glue:text}`ch04-pred-G`-dimensional subspace is null for the GGN to
# rounding, so the GGN has at least that many zero eigenvalues; it has
# {glue:text}`ch04-count-G` below $10^{-14}\lambda_{\max}$. The excess directions lie
# almost entirely in the first-layer weights; no symmetry we know predicts them, we have
# not identified their mechanism, and at our scale no clear gap separates them from the
# symmetry zeros. The symmetry count is therefore a lower bound that holds exactly; the
# total count of GGN zeros depends on the threshold.

# %%
ledger.add("M3", "Near-zero Hessian eigenvalues come from symmetries: counts match the symmetry dimension",
           {"linear softmax: predicted d+1 / counted (tau 1e-12)": [predicted_lin, counts_lin[1e-12]],
            "gap after the zeros (rel.)": float(rel_lin[predicted_lin]),
            "ReLU MLP Hessian: predicted shift + data / counted (tau 1e-14)": [predicted_H, counts_H[1e-14]],
            "ReLU rescaling dims (null only at a critical point)": width,
            "MLP GGN: predicted / counted (tau 1e-14)": [predicted_G, counts_G[1e-14]]},
           status="holds at our scale",
           note=("exact counts for the linear softmax and the MLP Hessian once rank-deficient active inputs are added; "
                 "the per-unit rescaling directions are Hessian null vectors only at a critical point (our GD point has "
                 f"gradient norm {fmt(grad_norm, 2)}; H t = -A g verified), and they are exact GGN null vectors; the GGN "
                 "has more near-zero eigenvalues than the symmetries predict, without a clean gap"))

# %% [markdown]
# ## Hessian, Gauss-Newton, Fisher
#
# For a model $f(\theta; x)$ and a loss $\ell(f, y)$, the chain rule splits the Hessian
# into a Gauss-Newton part and a residual part,
#
# $$
# \nabla^2_\theta L = \underbrace{J^\top \nabla^2_f \ell \; J}_{G\ \text{(GGN)}}
#   + \sum_k \partial_{f_k} \ell \; \nabla^2_\theta f_k ,
# $$ (eq-ch04-ggn)
#
# {cite}`schraudolph2002fast,martens2020new`. For a convex $\ell$, $G$ is positive
# semi-definite; the residual part is not, and it carries all the negative curvature. For
# the square loss $\partial_f \ell$ is the residual $f - y$, so $H = G$ wherever the
# residuals vanish. Sympy confirms {eq}`eq-ch04-ggn` for the square loss of a two-weight
# tanh model $f = w_2 \tanh(w_1 x)$ on two examples (the difference expands to exactly zero):

# %%
w1, w2 = sp.symbols("w_1 w_2", real=True)
f_of = lambda xi: w2 * sp.tanh(w1 * xi)
L_sq = sum(sp.Rational(1, 2) * (f_of(xi) - yi) ** 2 for xi, yi in ((x1, y1), (x2, y2)))
J_sq = sp.Matrix([[sp.diff(f_of(xi), q) for q in (w1, w2)] for xi in (x1, x2)])
residual_term = sum(((f_of(xi) - yi) * sp.hessian(f_of(xi), (w1, w2)) for xi, yi in ((x1, y1), (x2, y2))), sp.zeros(2, 2))
assert sp.expand(sp.hessian(L_sq, (w1, w2)) - (J_sq.T * J_sq + residual_term)) == sp.zeros(2, 2)
display(Math(r"\big(\nabla^2 L - J^\top J\big)_{12} = \sum_i (f_i - y_i)\, \partial_{w_1}\partial_{w_2} f_i = "
             + sp.latex(residual_term[0, 1])))

# %% [markdown]
# Numerically, `lossgeom.curvature.dense_ggn` builds $G$ from the output Jacobian and
# `ggn_operator` multiplies by it matrix-free; curvlinops' `GGNLinearOperator` computes the
# same product. On three random vectors, at zero residual (targets set to the network's
# own outputs, square loss) the Hessian and the GGN agree; with the real one-hot targets
# they do not:

# %%
with torch.no_grad():
    own_outputs = torch.func.functional_call(model, params, (x,))
one_hot = torch.nn.functional.one_hot(y, K).to(torch.float64)


def hessian_minus_ggn(targets):
    """max |(H - G) v| / max |H v| over the three probe vectors, square loss."""
    Hv = cv.hessian_operator(loss_closure(model, x, targets, loss="mse"), params) @ probe
    Gv = cv.ggn_operator(model, params, x, targets, loss="mse") @ probe
    return np.abs(Hv - Gv).max() / np.abs(Hv).max()


gap_zero, gap_real = hessian_minus_ggn(own_outputs), hessian_minus_ggn(one_hot)
G_op = cv.ggn_operator(model, params, x, y)
G_curvlinops = curvlinops.GGNLinearOperator(model, torch.nn.CrossEntropyLoss(), list(model.parameters()), [(x, y)])
err_ggn = np.abs(G_op @ probe - G_curvlinops.to_scipy() @ probe).max() / np.abs(G @ probe).max()
assert gap_zero <= 1e-12 and gap_real >= 1e-2 and err_ggn <= 1e-12
print(f"square loss, 3 random probes: max |(H - G) v| / max |H v| <= 1e-12 at zero residual, {fmt(gap_real, 3)} with one-hot targets")
print(f"GGN operator vs curvlinops on 3 random vectors: relative error <= 1e-12")

# %% [markdown]
# For the cross-entropy the Fisher information of the model's predictive distribution,
# $F = \frac1N\sum_i \mathbb{E}_{\hat y \sim p_i}[\nabla \log p_i(\hat y)\nabla \log p_i(\hat y)^\top]$,
# equals $G$ exactly, because softmax with cross-entropy is an exponential family in its
# natural parameters {cite}`martens2020new`. The *empirical* Fisher
# $\frac1N\sum_i g_i g_i^\top$, built from the gradients at the observed labels, is a
# different matrix {cite}`kunstner2019limitations`. We check $F = G$ on the three probe
# vectors and compare the spectra at the trained network:

# %%
F_true = cv.fisher_operator(model, params, x, y, kind="true")
F_emp = cv.dense_fisher(model, params, x, y, kind="empirical").numpy()
eigs_emp = np.linalg.eigvalsh(F_emp)
assert np.abs(F_true @ probe - G @ probe).max() <= 1e-13 * np.abs(G @ probe).max()
assert eigs_G[0] >= -1e-14 * eigs_G[-1] and eigs_emp[0] >= -1e-14 * eigs_emp[-1] and eigs[0] < -1e-4 * eigs[-1]
spectra = {"Hessian": eigs, "GGN (= true Fisher)": eigs_G, "empirical Fisher": eigs_emp}
for name, e in spectra.items():
    print(f"{name:20s}: largest {fmt(e[-1], 5)}, smallest {fmt(e[0], 3) if e[0] < -1e-14 * e[-1] else '>= -1e-14 x largest'}, "
          f"trace {fmt(e.sum(), 5)}")
glue("ch04-ggn-max", float(eigs_G[-1]), display=False)
glue("ch04-ef-max", float(eigs_emp[-1]), display=False)
glue("ch04-ef-trace", float(eigs_emp.sum()), display=False)

# %%
matrix_contract = density_contract.with_(
    directions="all of parameter space (full spectra of three matrices)",
    resolution="every eigenvalue (numpy.linalg.eigvalsh of the dense float64 matrices)",
)
fig, ax = plt.subplots()
for name, e in spectra.items():
    ax.plot(np.arange(1, len(e) + 1), e[::-1], lw=1.2, label=name)
ax.set_yscale("symlog", linthresh=1e-4)
ax.set_xlabel("eigenvalue index (largest first)")
ax.set_ylabel(r"eigenvalue (symlog, linear below $10^{-4}$)")
ax.legend()
glue_figure("ch04-matrices", fig, matrix_contract,
    "Sorted spectra of the Hessian, the GGN (equal to the true Fisher for cross-entropy) and the empirical Fisher")

# %% [markdown]
# ```{glue:figure} fig-ch04-matrices
# :name: fig-ch04-matrices
#
# {glue:text}`cap-ch04-matrices`
# ```
#
# {numref}`fig-ch04-matrices` shows the three answers to "how curved is it here". The GGN
# follows the Hessian in the top eigenvalues (its largest is
# {glue:text}`ch04-ggn-max:.4g` against {glue:text}`ch04-lammax:.4g`) but has no
# negative tail; the empirical Fisher is smaller at the top ({glue:text}`ch04-ef-max:.3g`)
# and in trace ({glue:text}`ch04-ef-trace:.3g` against {glue:text}`ch04-trace:.4g`): at a
# well-fit point the gradients at the observed labels are small, while the model's own
# predictive distribution, which the true Fisher averages over, still has spread. A flatness number is a
# statement about one of these matrices, and the report has to say which.

# %%
ledger.add("M4", "GGN and Fisher are PSD, the Hessian can have negative curvature; they agree at zero residual for square loss",
           {"lambda_min: Hessian": float(eigs[0]), "lambda_min/lambda_max: GGN, empirical Fisher": ">= -1e-14",
            "max|(H - G)v| / max|Hv|, square loss, zero residual": "<= 1e-12",
            "same, one-hot targets": float(gap_real),
            "max|(F_true - G)v| / max|Gv|, cross-entropy, 3 probes": "<= 1e-13",
            "lambda_max: H, GGN, empirical Fisher": [float(eigs[-1]), float(eigs_G[-1]), float(eigs_emp[-1])]})

# %% [markdown]
# ## What this establishes
#
# On a network small enough to diagonalise, Lanczos, Hutchinson and stochastic Lanczos
# quadrature reproduce the dense spectrum with the accuracy they report, and each summary
# of that spectrum answers its own question: the trace was positive and large while
# {glue:text}`ch04-nneg` directions curved downwards, and the condition number was set by
# the threshold that defines it. The exact zeros were all accounted for: softmax shifts
# (translations, null everywhere), per-unit ReLU rescalings (null only at a critical
# point, and always null for the Gauss-Newton matrix), and rank-deficient inputs. None of
# them says anything about how robust the learned function is. The chapter does not show
# that the small but non-zero eigenvalues are meaningless, nor that the symmetry count is
# the whole null space of the GGN at larger scale. The next chapter couples the largest
# eigenvalue to the step size of gradient descent.
#
# ## Results ledger

# %%
ledger
