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
# (ch-saddles-optimisers)=
# # Saddles, plateaus and optimisers
#
# Two optimisers started at the same point on the same loss can end at different places,
# and a point where the gradient vanishes can be a trap, a doorway or a gentle slope
# depending on curvature that the gradient does not show. This chapter asks what an update
# rule adds to the geometry of a loss. It starts from the optimiser lab of the source: three
# update rules on three two-dimensional objectives (a ravine, a strict saddle and a quartic
# plateau), reimplemented in `lossgeom_book.dynamics` and compared at every step with an
# independent implementation. It then shows how a small random kick turns a saddle from a
# trap into a doorway (perturbed gradient descent), and why reaching a second-order
# stationary point is still not success. Moving to a small network on real digits, it shows
# that a gradient step depends on the coordinates while a natural-gradient step does not,
# measures how mini-batch gradient noise is spread over Hessian directions, how batch size
# changes where SGD ends, and how momentum and Adam reshape that noise. It closes by deriving
# when decoupled weight decay and L2 regularisation are the same algorithm, running a matched
# comparison of AdamW and momentum SGD, and showing that optimiser, sampler and precision
# state are all part of a trajectory.
#
# ```{admonition} Key ideas
# :class: tip
# - One number per direction, the factor $1 - \eta\lambda$ of {numref}`Chapter %s <ch-step-size>`,
#   explains what gradient descent, momentum and Adam do on a ravine, a saddle and a plateau.
# - A zero gradient can be a saddle or a plateau; a tiny random kick escapes the saddle, but
#   reaching a second-order stationary point says nothing about the predictor there.
# - A gradient step depends on the coordinates; a natural-gradient step changes the
#   prediction the same way at every equivalent point.
# - Mini-batch noise is concentrated along high-curvature directions, and batch size,
#   momentum and Adam change where it goes and where training ends.
# - Weight decay and L2 regularisation are one algorithm only for plain SGD, and a checkpoint
#   without its optimiser, sampler and precision state starts a different run.
# ```
#
# **Claims established here** (ids from the book's claim list): M7, M8, M9, M10, M14, M15.
#
# Each status in the ledger at the end is read from the outputs by one rule, with each
# claim's criterion stated before its row: **holds** for an identity or a derivation (exact
# here; the numeric checks confirm, to rounding, only that the code implements it) and for a
# statement about the source's two-dimensional objectives that the runs meet at the source's
# own settings, where no scale enters; **holds at our scale** when every measured part of the
# claim meets its criterion on the small digits network here, and any level the source states
# is met or accounted for by a computation here; **differs** when a measured part misses its
# criterion or goes the other way; **not reproduced** when the measurements show none of the
# effect the claim describes.
#
# We load the tools once. The networks here are tiny, so torch runs on one thread, which
# is faster for them and does not compete with other processes:

# %% tags=["remove-cell"]
# Only on Google Colab: install the book's package and what the chapter imports.
import subprocess, sys
if "google.colab" in sys.modules:
    book = "lossgeom[book] @ git+https://github.com/lossgeom/same-function-different-geometry@main"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", book], check=True)

# %% tags=["hide-cell"]
from lossgeom_book.setup import setup

ledger = setup("Saddles, plateaus and optimisers", single_thread=True)

# %% tags=["hide-input"]
import numpy as np
import sympy as sp
import torch
from torch import nn
import matplotlib.pyplot as plt
from IPython.display import Math, display

from lossgeom import curvature, models, training
from lossgeom.contract import MeasurementContract
from lossgeom.formatting import fmt, rounding_level
from lossgeom.parameters import params_of
from lossgeom_book import data, dynamics, product
from lossgeom_book import noise as noise_probes
from lossgeom_book.display import glue_figure, glue_value
from lossgeom_book.dynamics import LabConfig, run_lab
from lossgeom_book.models import mlp

# %% [markdown]
# ## Three objectives with known critical points
#
# The lab's objectives are a ravine with curvature ratio $\kappa = 20$, a strict saddle and
# a plateau:
#
# $$
# \begin{aligned}
# r(x, y) &= \tfrac12 (x^2 + \kappa y^2), \\
# f(x, y) &= \tfrac12 x^2 - \tfrac12 y^2 + \tfrac14 y^4, \\
# g(x, y) &= \tfrac12 x^2 + \tfrac14 y^4 .
# \end{aligned}
# $$ (eq-ch06-objectives)
#
# We write them in sympy:

# %%
x, y, kappa, eta = sp.symbols("x y kappa eta", real=True)
objectives = {"ravine": (x**2 + kappa * y**2) / 2,
              "saddle": x**2 / 2 - y**2 / 2 + y**4 / 4,
              "plateau": x**2 / 2 + y**4 / 4}

# %% [markdown]
# Their Hessians at the origin are diagonal, and sympy confirms which sign each curvature has:

# %%
origin = {x: 0, y: 0}
hessian_at_origin = {name: sp.hessian(f, (x, y)).subs(origin) for name, f in objectives.items()}
assert hessian_at_origin["ravine"] == sp.diag(1, kappa)
assert hessian_at_origin["saddle"] == sp.diag(1, -1)
assert hessian_at_origin["plateau"] == sp.diag(1, 0)

# %%
letters = {"ravine": "r", "saddle": "f", "plateau": "g"}
display(Math(r",\quad ".join(rf"\nabla^2 {letters[k]}(0) = {sp.latex(h)}"
                             for k, h in hessian_at_origin.items())))

# %% [markdown]
# The saddle objective's critical points and their values:

# %%
saddle_critical = sp.solve([sp.diff(objectives["saddle"], v) for v in (x, y)], [x, y], dict=True)
saddle_values = sorted({objectives["saddle"].subs(point) for point in saddle_critical})
assert saddle_values == [sp.Rational(-1, 4), 0]
print("critical points of f:", saddle_critical, "with values", saddle_values)

# %% [markdown]
# So the origin is a strict saddle of $f$ (one eigenvalue $-1$) next to two minima with loss
# $-1/4$ at $y = \pm 1$, a minimum of $g$ with a zero eigenvalue along $y$, and the minimum of
# the ravine. Both $f$ and $g$ have zero gradient *and* the same first-order picture at the
# origin; only the sign of the curvature along $y$ (or its absence) tells them apart. The
# package's `lossgeom_book.dynamics.lab_objective` implements the three with hand-written
# gradients; we compare them with sympy's at 50 random points:

# %%
points = np.random.default_rng(0).uniform(-2, 2, size=(50, 2))
def gradient_gap(name):
    exact = sp.lambdify((x, y), [sp.diff(objectives[name], v).subs(kappa, 20) for v in (x, y)])
    return max(np.abs(np.subtract(dynamics.lab_objective(name, *p)[1], exact(*p))).max()
               for p in points)


# %%
gradient_gaps = {name: gradient_gap(name) for name in objectives}
print("largest gradient difference from sympy:",
      ", ".join(f"{name} {rounding_level(gap)}" for name, gap in gradient_gaps.items()))

# %% [markdown]
# The hand-written gradients agree with the symbolic ones to rounding.
#
# ## The optimiser lab
#
# `lossgeom_book.dynamics.run_lab` runs gradient descent, heavy-ball momentum
# ($v \leftarrow \mu v + \nabla$, step $\eta v$, $\mu = 0.9$) and Adam (first-moment decay
# $0.9$, second-moment decay $0.999$, bias correction, $\epsilon = 10^{-8}$ added after the
# square root, coordinate-wise) for 120 steps, one gradient evaluation per step, so every
# run has the same budget. The ravine starts at $(4, 4)$, the saddle and plateau at
# $(0, 10^{-3})$. These are the source's settings. We run the whole grid, two learning rates
# for each optimiser and objective:

# %%
lab = dynamics.run_lab_grid(learning_rates=(0.04, 0.1), steps=120)
print(f"{'objective':9} {'optimiser':9} {'lr':>5} {'final loss':>12} {'x':>12} {'y':>12}")
for (optimiser, objective, lr), trajectory in lab.items():
    final = "".join(f"{fmt(trajectory.final[k]):>13}" for k in ("loss", "x", "y"))
    print(f"{objective:9} {optimiser:9} {fmt(lr):>5}" + final)

# %% [markdown]
# The table is the lab's result at its own budget, to six significant digits. Is
# `run_lab` really those update rules? A second implementation answers that: the same
# 18 runs with `torch.optim.SGD` (with and without momentum) and `torch.optim.Adam`, with
# gradients from torch autograd instead of the hand-written ones
# (`lossgeom_book.dynamics.run_lab_torch_optim`). We compare $x$, $y$ and the loss at every one
# of the 121 points of every run:

# %%
reference = dynamics.run_lab_grid((0.04, 0.1), 120, runner=dynamics.run_lab_torch_optim)
lab_gap = max(dynamics.trajectory_discrepancy(lab[key], reference[key]) for key in lab)
print(f"{len(lab)} runs x 121 points, largest relative difference: "
      f"{rounding_level(lab_gap, 1e-10)}")

# %% [markdown]
# The two implementations agree to at least ten significant digits at every step: they
# differ only in the order of their roundings (Adam's division by $\sqrt{\hat v}$ near the
# minimum amplifies the last bits a little). Both are ours, though. The source's lab is a
# short program of its own; we rewrite its update rules here in another form, without
# reusing its code: both coordinates in one array, gradients and losses from the sympy
# objectives above (at $\kappa = 20$), and all three updates computed at every step, one of
# them taken. As in the source, Adam's first-moment decay is the momentum coefficient $0.9$
# and its bias corrections use the step count $n = 1, 2, \dots$:

# %%
at_kappa_20 = {name: f.subs(kappa, 20) for name, f in objectives.items()}
sympy_gradients = {name: sp.lambdify((x, y), [sp.diff(f, v) for v in (x, y)])
                   for name, f in at_kappa_20.items()}
sympy_losses = {name: sp.lambdify((x, y), f) for name, f in at_kappa_20.items()}


# %%
def seed_lab(optimiser, objective, lr, steps=120, mu=0.9, beta2=0.999, eps=1e-8):
    """The source's lab loop, rewritten: one array for (x, y), sympy gradients."""
    w = np.array([4.0, 4.0]) if objective == "ravine" else np.array([0.0, 1e-3])
    velocity, first, second, path = np.zeros(2), np.zeros(2), np.zeros(2), [w]
    for n in range(1, steps + 1):
        g = np.array(sympy_gradients[objective](*w), dtype=float)
        velocity = mu * velocity + g
        first, second = mu * first + (1 - mu) * g, beta2 * second + (1 - beta2) * g**2
        adam = first / (1 - mu**n) / (np.sqrt(second / (1 - beta2**n)) + eps)
        w = w - lr * {"gd": g, "momentum": velocity, "adam": adam}[optimiser]
        path.append(w)
    return np.array(path)


# %% [markdown]
# We compare $x$, $y$ and the loss with `run_lab` at every one of the 121 points of the same
# 18 runs (`trajectory_discrepancy` takes the two runs as trajectories):

# %%
def seed_trajectory(key):
    path = seed_lab(*key)
    loss = np.array([sympy_losses[key[1]](*point) for point in path], dtype=float)
    norm = np.array([np.hypot(*sympy_gradients[key[1]](*point)) for point in path])
    return dynamics.LabTrajectory(lab[key].config, lab[key].t, path[:, 0], path[:, 1], loss, norm)


# %%
seed_gap = max(dynamics.trajectory_discrepancy(lab[key], seed_trajectory(key)) for key in lab)
print(f"{len(lab)} runs x 121 points, largest relative difference from the source's update "
      f"rules: {rounding_level(seed_gap, 1e-12)}")

# %% tags=["remove-cell"]
glue_value("ch06-seed-gap", rounding_level(seed_gap, 1e-12))

# %% [markdown]
# The book's lab and the source's update rules agree at every point of every run, the largest
# relative difference lying {glue:text}`ch06-seed-gap`: the two differ only in the order of a
# few roundings (how the squared gradient and the losses are formed). `tests/test_dynamics.py`
# checks the same 18 runs against a direct transcription of the source's program as well.
#
# Three rows of the table deserve an explanation, and each comes from curvature. First,
# gradient descent on the ravine at learning rate 0.1:

# %%
gd_at_edge = lab[("gd", "ravine", 0.1)]
assert np.all(np.abs(gd_at_edge.y) == 4.0)
shallow_rest = 0.5 * gd_at_edge.final["x"] ** 2
print(f"eta * kappa = {fmt(0.1 * 20)}: |y_t| = 4 at all 121 points; "
      f"final x = {fmt(gd_at_edge.final['x'])}")

# %% tags=["remove-cell"]
glue_value("ch06-ravine-rest", shallow_rest, 3)


# %% [markdown]
# **The ravine at learning rate 0.1.** Gradient descent on a quadratic multiplies the error
# along an eigenvector with eigenvalue $\lambda$ by $1 - \eta\lambda$ at every step, and is
# stable only for $0 < \eta\lambda < 2$ ({numref}`Chapter %s <ch-step-size>`, claim M5). The
# steep direction of the ravine has $\lambda = \kappa = 20$, so $\eta = 0.1$ sits *exactly*
# on the boundary $\eta\kappa = 2$: the factor is $-1$ and $y$ flips between $+4$ and $-4$
# forever, while $x$ (factor $0.9$) converges. The final loss is the steep coordinate's
# $\tfrac12 \kappa\, 4^2 = 160$ plus what is left of $x$, $\tfrac12 x^2 =$
# {glue:text}`ch06-ravine-rest`. At $\eta = 0.04$ the steep factor is $0.2$ and the shallow
# one $0.96$: the shallow coordinate, not the steep one, sets the pace.
#
# Heavy-ball momentum has a larger stable range, $0 < \eta\lambda < 2(1 + \mu) = 3.8$, so it
# converges at $\eta = 0.1$. We check that limit by moving $\kappa$ to either side of it:

# %%
def heavy_ball_final_y(curvature_ratio, steps=400):
    return abs(run_lab(LabConfig("momentum", "ravine", 0.1, steps, kappa=curvature_ratio)).y[-1])
heavy_ball = {k: heavy_ball_final_y(k) for k in (37.0, 39.0)}
assert heavy_ball[37.0] < 1e-3 < 1e3 < heavy_ball[39.0]
print(f"|y| after 400 steps: {fmt(heavy_ball[37.0], 3)} at eta kappa = 3.7, "
      f"{fmt(heavy_ball[39.0], 3)} at 3.9")

# %% [markdown]
# Just inside the limit the steep coordinate has converged; just outside it has exploded.
# Adam divides each coordinate's step by its own gradient scale, so both coordinates move at
# nearly the same speed whatever the curvature:

# %%
adam_ravine = lab[("adam", "ravine", 0.04)].final
print(f"Adam, lr 0.04, after 120 steps: x = {fmt(adam_ravine['x'])}, y = {fmt(adam_ravine['y'])}")

# %% tags=["remove-cell"]
glue_value("ch06-adam-xy-gap", abs(adam_ravine["x"] - adam_ravine["y"]), 3)

# %% [markdown]
# At $\eta = 0.04$ Adam's final $x$ and $y$ differ by only {glue:text}`ch06-adam-xy-gap`.
# That makes Adam insensitive to the ill-conditioning, and also slow here, since its step
# is about $\eta$ per coordinate however far the minimum is.

# %% tags=["hide-input"]
lab_contract = MeasurementContract(
    centre="start (4, 4); minimum at the origin",
    directions="the (x, y) plane of the objective itself",
    normalisation="unnormalised coordinates", radius="|x|, |y| <= 4.5",
    loss="ravine r = 1/2 (x^2 + 20 y^2)", reduction="n/a (deterministic objective)",
    data="n/a (synthetic objective)", model_mode="n/a (no model)",
    resolution="every iterate of 120 steps; contours on a 201 x 201 grid", precision="float64")
grid = np.linspace(-4.5, 4.5, 201)
grid_x, grid_y = np.meshgrid(grid, grid)
fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.6), sharey=True, layout="constrained")
for ax, lr in zip(axes, (0.04, 0.1)):
    ax.contour(grid_x, grid_y, 0.5 * (grid_x**2 + 20 * grid_y**2),
               levels=np.geomspace(0.05, 250, 12), colors="grey", linewidths=0.5)
    for optimiser, style in zip(dynamics.LAB_OPTIMISERS, ("-o", "-", "--")):
        trajectory = lab[(optimiser, "ravine", lr)]
        ax.plot(trajectory.x, trajectory.y, style, ms=2, lw=0.9, label=optimiser)
    ax.set_title(f"learning rate {fmt(lr)} (eta kappa = {fmt(lr * 20)})")
    ax.set_xlabel("x (shallow, curvature 1)")
axes[0].set_ylabel("y (steep, curvature 20)")
axes[0].legend(loc="lower right")
glue_figure("ch06-ravine", fig, lab_contract,
            "Trajectories of gradient descent, heavy-ball momentum and Adam on the ravine "
            "at two learning rates")

# %% [markdown]
# ```{glue:figure} fig-ch06-ravine
# :name: fig-ch06-ravine
#
# {glue:text}`cap-ch06-ravine`
#
# {glue:md}`con-ch06-ravine`
# ```
#
# In {numref}`fig-ch06-ravine` gradient descent at $\eta = 0.1$ bounces between the two
# walls of the ravine at constant height, momentum spirals in, and Adam travels along the
# diagonal because it takes steps of nearly equal size in both coordinates.
#
# M8 is an identity: the book's lab and the source's update rules are one algorithm written
# twice. It holds if, at every point of the 18 runs, the book's lab agrees with the rewritten
# source rules to rounding (below $10^{-12}$, relative) and with `torch.optim` on autograd
# gradients below $10^{-10}$; the largest gaps lie {glue:text}`ch06-seed-gap` and
# {glue:text}`ch06-lab-gap`.

# %% tags=["remove-cell"]
m8_status = "holds" if seed_gap < 1e-12 and lab_gap < 1e-10 else "differs"
glue_value("ch06-lab-gap", rounding_level(lab_gap, 1e-10))
ledger.add("M8", "Optimiser lab: GD, momentum and Adam on the ravine ($\\kappa = 20$), saddle "
           "and plateau at a matched budget; the book's dynamics reproduce the seed's lab",
           f"{len(lab)} runs, every point: relative gap to the seed's rules "
           f"{rounding_level(seed_gap, 1e-12)}",
           details={"runs": "3 optimisers x 3 objectives x lr {0.04, 0.1}, 120 steps, one gradient each",
            "largest relative difference from the seed's update rules (rewritten here)":
                rounding_level(seed_gap, 1e-12),
            "largest relative difference from torch.optim + autograd":
                rounding_level(lab_gap, 1e-10),
            "GD ravine lr 0.1: |y_t| at every step": 4.0, "Adam ravine lr 0.04: |x - y|":
            abs(adam_ravine["x"] - adam_ravine["y"])}, sig=3, status=m8_status,
           note="every point of all 18 runs compared in the chapter with the seed lab's update "
                "rules, rewritten with sympy gradients, and with torch.optim.SGD/Adam on autograd "
                "gradients: both agree to rounding" if m8_status == "holds"
                else "the book's lab departs from the source's update rules")

# %% [markdown]
# ## A saddle is a doorway, a plateau is not
#
# Near the origin the saddle's gradient step acts on $y$ as $y \mapsto (1 + \eta)\,y$, the
# factor $1 - \eta\lambda$ with $\lambda = -1$, so a start at $y_0$ grows geometrically.
# Sympy derives the factor:

# %%
step_saddle = sp.expand(y - eta * sp.diff(objectives["saddle"], y))
linear_factor = sp.diff(step_saddle, y).subs(y, 0)
assert sp.simplify(linear_factor - (1 + eta)) == 0

# %% [markdown]
# On the plateau $y \mapsto y - \eta y^3$; the continuous-time version of that recursion,
# $\dot y = -\eta y^3$, shows how slowly $y$ decays. Sympy verifies its solution and writes
# the linearised time to escape from $y_0$ to $|y| = 1$ on the saddle:

# %%
y0, t = sp.symbols("y_0 t", positive=True)
eta_pos = sp.symbols("eta", positive=True)
escape_time = sp.log(1 / y0) / sp.log(1 + eta_pos)
plateau_flow = y0 / sp.sqrt(1 + 2 * eta_pos * y0**2 * t)
assert sp.simplify(sp.diff(plateau_flow, t) + eta_pos * plateau_flow**3) == 0

# %%
display(Math(r"\begin{aligned}&\text{saddle: } y_{t+1} \approx (" + sp.latex(linear_factor) + r")\, y_t,\ "
             r"t_{\rm escape} \approx " + sp.latex(escape_time) + r";\\"
             r"&\text{plateau: } y(t) = " + sp.latex(plateau_flow) + r"\end{aligned}"))

# %% [markdown]
# We evaluate both at the lab's settings, $\eta = 0.1$ and $y_0 = 10^{-3}$:

# %%
kick = {y0: sp.Rational(1, 1000), eta_pos: sp.Rational(1, 10)}
escape_prediction = float(escape_time.subs(kick))
plateau_prediction = float(plateau_flow.subs({**kick, t: 80}))

# %% [markdown]
# The linearised escape takes about {glue:text}`ch06-escape-steps` steps; on the plateau,
# after 80 steps the flow has moved $y$ by a relative {glue:text}`ch06-plateau-rel`. The
# source's own self-check asserts three facts at learning rate 0.1 and 80 steps; we run
# `lossgeom_book.dynamics` on them:

# %%
exact = run_lab(LabConfig("gd", "saddle", 0.1, steps=80, perturbation=0.0))
escaped = run_lab(LabConfig("gd", "saddle", 0.1, steps=80, perturbation=1e-3))
plateau = run_lab(LabConfig("gd", "plateau", 0.1, steps=80, perturbation=1e-3))
first_below = dynamics.first_step_below(escaped.loss, -0.20)

# %% [markdown]
# and assert them, with the plateau's $|y|$ falling at every step:

# %%
assert exact.loss[-1] == 0.0 and np.all(exact.x == 0.0) and np.all(exact.y == 0.0)
assert escaped.loss[-1] < -0.20 and first_below is not None
assert np.all(plateau.loss >= 0.0) and np.all(np.diff(np.abs(plateau.y)) <= 0)

# %% tags=["remove-cell"]
glue_value("ch06-escape-steps", escape_prediction, 3)
glue_value("ch06-plateau-rel", 1 - plateau_prediction / 1e-3, 2)
glue_value("ch06-plateau-loss", plateau.loss[-1], 2)

# %%
print(f"saddle from y = 0: loss {fmt(exact.loss[-1])} after 80 steps (x = y = 0 throughout)")
print(f"saddle from y = 0.001: loss {fmt(escaped.loss[-1])} at step 80; "
      f"first below -0.20 at step {first_below}")
print(f"plateau from y = 0.001: loss {fmt(plateau.loss[-1])}, y = {fmt(plateau.y[-1])} "
      f"(flow prediction {fmt(plateau_prediction)})")

# %% [markdown]
# From exactly $y = 0$ the iterate never moves, because the gradient there is exactly zero
# in floating point too; a kick of $10^{-3}$ is amplified by $1.1$ per step until $y$ reaches
# the minimum at $|y| = 1$, as the escape estimate predicts. On the plateau the same kick
# is pulled back, but so slowly that $y$ is still almost $10^{-3}$ after 80 steps: the
# loss there is {glue:text}`ch06-plateau-loss`, small and nonnegative, and a gradient-norm
# stopping rule could not tell this point from the saddle.

# %% tags=["hide-input"]
saddle_contract = lab_contract.with_(
    centre="start (0, 0.001) (and (0, 0) for the exact run)",
    loss="saddle f and plateau g of eq. (eq-ch06-objectives)",
    radius="80 steps from the start", resolution="every step")
fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.4), layout="constrained")
axes[0].plot(escaped.t, escaped.loss, label="saddle f, start y = 0.001")
axes[0].plot(exact.t, exact.loss, "--", label="saddle f, start y = 0")
axes[0].plot(plateau.t, plateau.loss, ":", label="plateau g, start y = 0.001")
axes[0].axhline(-0.25, color="grey", lw=0.7)
axes[0].set_xlabel("step")
axes[0].set_ylabel("loss")
axes[0].legend()
axes[1].semilogy(escaped.t, np.abs(escaped.y), label="saddle |y|")
axes[1].semilogy(plateau.t, np.abs(plateau.y), ":", label="plateau |y|")
axes[1].semilogy(escaped.t, 1e-3 * 1.1 ** escaped.t, color="grey", lw=0.7, label="1e-3 x 1.1^t")
axes[1].set_ylim(5e-4, 2)
axes[1].set_xlabel("step")
axes[1].legend()
glue_figure("ch06-saddle", fig, saddle_contract,
            "Gradient descent at learning rate 0.1 on the strict saddle and on the plateau: "
            "loss and |y| per step")

# %% [markdown]
# ```{glue:figure} fig-ch06-saddle
# :name: fig-ch06-saddle
#
# {glue:text}`cap-ch06-saddle`
#
# {glue:md}`con-ch06-saddle`
# ```
#
# {numref}`fig-ch06-saddle` shows the straight line of geometric escape on the log scale
# (right) and the plateau's nearly constant $|y|$.
#
# M7 concerns the source's own objectives at its own settings (learning rate 0.1, 80 steps),
# so it holds if the three levels of the source's self-check are met there: the loss from
# $y = 0$ is exactly 0 with $x = y = 0$ throughout (here {glue:text}`ch06-m7-exact-loss`),
# the loss from $y = 0.001$ is below $-0.20$ at step 80 (here {glue:text}`ch06-m7-saddle-loss`,
# below from step {glue:text}`ch06-m7-first-below`), and the plateau's loss is at least 0 at
# every step while $|y|$ falls (its smallest value {glue:text}`ch06-m7-plateau-min`).

# %% tags=["remove-cell"]
m7_levels = [exact.loss[-1] == 0.0 and np.all(exact.x == 0.0) and np.all(exact.y == 0.0),
             escaped.loss[-1] < -0.20,
             plateau.loss.min() >= 0.0 and np.all(np.diff(np.abs(plateau.y)) <= 0)]
m7_status = "holds" if all(m7_levels) else "differs"
glue_value("ch06-m7-exact-loss", fmt(exact.loss[-1]))
glue_value("ch06-m7-saddle-loss", fmt(escaped.loss[-1]))
glue_value("ch06-m7-first-below", first_below)
glue_value("ch06-m7-plateau-min", plateau.loss.min(), 3)
ledger.add("M7", "From $y = 0$ GD never moves; from $y = 0.001$ it escapes the saddle (loss "
           "$< -0.20$ after 80 steps at $\\eta = 0.1$) and returns on the plateau",
           f"loss after 80 steps: {fmt(exact.loss[-1])} from $y = 0$, {fmt(escaped.loss[-1])} "
           f"from $y = 0.001$ (below $-0.20$ from step {first_below})",
           details={"loss from y=0": float(exact.loss[-1]),
            "saddle loss at step 80": float(escaped.loss[-1]),
            "first step below -0.20": first_below,
            "plateau loss at step 80": float(plateau.loss[-1]),
            "plateau |y| at step 80 / 0.001": float(abs(plateau.y[-1]) / 1e-3)},
           reported="the seed's self_check: loss $= 0$, $< -0.20$, $\\geq 0$", status=m7_status,
           note="" if m7_status == "holds"
                else "a level of the source's self-check is missed at its own settings")

# %% [markdown]
# ## Perturbed gradient descent
#
# Started anywhere on the saddle's stable manifold, the line $y = 0$, plain gradient
# descent converges to the saddle itself: $x$ shrinks by $1 - \eta$ per step and $y$ stays
# exactly zero. {cite:t}`jin2017escape` add a perturbation drawn uniformly from a small ball
# whenever the gradient is small (and no perturbation happened recently); the negative
# curvature then amplifies the component along $y$ as above.
# `lossgeom_book.dynamics.perturbed_gradient_descent` implements that rule. We start at
# $(1, 0)$ and run plain gradient descent and the perturbed version over 20 seeds, with
# radius $10^{-3}$, gradient threshold $10^{-3}$ and a waiting time of 20 steps:

# %%
start, saddle_objective = np.array([1.0, 0.0]), dynamics.saddle_loss_and_grad
pgd_settings = dict(radius=1e-3, gradient_threshold=1e-3, wait=20)
plain = dynamics.perturbed_gradient_descent(saddle_objective, start, 0.1, 400, radius=0.0)
pgd_runs = [dynamics.perturbed_gradient_descent(saddle_objective, start, 0.1, 400, seed=s,
                                                **pgd_settings) for s in range(20)]

# %% [markdown]
# Plain gradient descent stays on $y = 0$ and ends at the saddle; every perturbed run ends at
# a minimum:

# %%
pgd_escape = [dynamics.first_step_below(run.loss, -0.2) for run in pgd_runs]
assert np.all(plain.path[:, 1] == 0.0) and np.linalg.norm(plain.path[-1]) < 1e-15
assert None not in pgd_escape and all(run.loss[-1] < -0.2499 for run in pgd_runs)
print(f"plain GD: final point ({fmt(plain.path[-1, 0], 3)}, {fmt(plain.path[-1, 1], 3)}), "
      f"loss {fmt(plain.loss[-1], 3)}")

# %%
escaping = sum(step is not None for step in pgd_escape)
print(f"perturbed GD: {escaping} of {len(pgd_runs)} seeds escape; first perturbation at step "
      f"{pgd_runs[0].perturbed_at[0]}; loss < -0.2 at steps {min(pgd_escape)}-{max(pgd_escape)} "
      f"(median {fmt(np.median(pgd_escape))})")

# %% [markdown]
# Every seed escapes and ends at a minimum with loss $-1/4$, while plain gradient descent
# sits on the saddle with zero loss. The perturbation is tiny (radius $10^{-3}$) and is
# applied only after the gradient has become small, so before that moment the two runs are
# identical.

# %% tags=["hide-input"]
pgd_contract = saddle_contract.with_(
    centre="start (1, 0), on the stable manifold y = 0 of the saddle",
    radius="400 steps from the start",
    loss="saddle f = 1/2 x^2 - 1/2 y^2 + 1/4 y^4",
    resolution="every step; perturbation radius 1e-3, gradient threshold 1e-3, wait 20, 20 seeds")
fig, ax = plt.subplots()
for pgd_run in pgd_runs:
    ax.plot(pgd_run.loss, color="C1", lw=0.6, alpha=0.6)
ax.plot(plain.loss, color="C0", lw=1.5, label="plain gradient descent")
ax.plot([], [], color="C1", label="perturbed gradient descent (20 seeds)")
ax.set_xlabel("step")
ax.set_ylabel("loss")
ax.legend()
glue_figure("ch06-pgd", fig, pgd_contract,
            "Loss of plain and perturbed gradient descent (learning rate 0.1) started on the "
            "saddle's stable manifold")

# %% [markdown]
# ```{glue:figure} fig-ch06-pgd
# :name: fig-ch06-pgd
#
# {glue:text}`cap-ch06-pgd`
#
# {glue:md}`con-ch06-pgd`
# ```
#
# {numref}`fig-ch06-pgd` is the saddle lab's lesson made algorithmic. What it does not
# show: the stable manifold of a strict saddle has measure zero, so a *randomly initialised*
# gradient descent almost surely avoids it too; the point of {cite:t}`jin2017escape` is a
# bound on how long escaping takes, which a two-dimensional example cannot test.
#
# ## Second-order stationarity is not a success criterion
#
# What perturbed gradient descent guarantees is an *approximate second-order stationary
# point*: $\lVert\nabla L\rVert \le \epsilon$ and $\lambda_{\min}(\nabla^2 L) \ge -\gamma$ for
# stated tolerances. That is a statement about the objective near a point, not about the
# predictor there. To see the difference we need a real model. From here on we use sklearn's
# bundled 8x8 digits (`lossgeom_book.data`, 512 training and 500 test images, pixels in $[0, 1]$)
# and a small tanh MLP 64-16-10 (1,210 parameters) with cross-entropy loss:

# %%
split = data.digits(512, 500, seed=0)
net = mlp([64, 16, 10], "tanh", seed=0)
batch_loss = training.indexed_loss(net, nn.CrossEntropyLoss(), (split.x_train, split.y_train))
full_loss = lambda params: batch_loss(params, None)
theta0 = params_of(net)

# %% [markdown]
# We train it with 200 steps of momentum SGD (learning rate 0.1, $\mu = 0.9$, batch 32):

# %%
warm = training.train(batch_loss, theta0, training.sgd(0.1, momentum=0.9), 200,
                        batches=training.batch_schedule(512, 32, 200, seed=0))
print(f"training loss {fmt(full_loss(theta0))} at initialisation, "
      f"{fmt(full_loss(warm.params))} after 200 steps")

# %% [markdown]
# The second network is a ReLU MLP of the same shape whose hidden units are all dead (a
# large negative first-layer bias, as a too-large learning rate can leave behind), with its
# output bias set to the log class frequencies:

# %%
relu_net = mlp([64, 16, 10], "relu", seed=0)
relu_loss = training.indexed_loss(relu_net, nn.CrossEntropyLoss(), (split.x_train, split.y_train))
dead = params_of(relu_net) | {"0.bias": torch.full((16,), -10.0)}
dead["2.bias"] = torch.log(torch.bincount(split.y_train, minlength=10) / 512.0)
assert (split.x_train @ dead["0.weight"].T + dead["0.bias"]).max() < 0  # every unit off

# %% [markdown]
# A dead unit passes no gradient and no curvature to any weight, and the bias makes the
# softmax output the class frequencies, whose cross-entropy gradient is zero. We will need
# the test accuracy of each network (`lossgeom.models.accuracy`, the fraction of test images
# whose largest logit is the label):

# %%
test_data = (split.x_test, split.y_test)

# %% [markdown]
# `lossgeom_book.dynamics.second_order_stationarity` measures the gradient norm and the extreme
# Hessian eigenvalues (Lanczos on Hessian-vector products). We apply it to both networks:

# %%
networks = {"trained tanh MLP": (net, full_loss, warm.params),
            "dead-ReLU MLP": (relu_net, lambda p: relu_loss(p, None), dead)}
stationarity = {name: dynamics.second_order_stationarity(loss, params)
                for name, (_, loss, params) in networks.items()}
accuracy = {name: models.accuracy(model, test_data, params=params)
            for name, (model, _, params) in networks.items()}


# %% [markdown]
# Values below $10^{-13}$ are reported as rounding level:

# %%
def measured(value, sig=3):
    return str(rounding_level(value)) if abs(value) < 1e-13 else fmt(value, sig)
for name, report in stationarity.items():
    print(f"{name}: loss {fmt(report.loss, 5)}, |grad| {measured(report.gradient_norm)}, "
          f"lambda_min {measured(report.smallest_eigenvalue)}, "
          f"lambda_max {measured(report.largest_eigenvalue)}, "
          f"approximate SOSP (1e-3, 1e-3): {report.is_second_order_stationary(1e-3, 1e-3)}, "
          f"test accuracy {fmt(accuracy[name], 3)}")

# %%
assert stationarity["dead-ReLU MLP"].is_second_order_stationary(1e-12, 1e-12)
assert not stationarity["trained tanh MLP"].is_second_order_stationary(1e-3, 1e-3)
assert accuracy["dead-ReLU MLP"] < 0.2 < 0.8 < accuracy["trained tanh MLP"]
frequencies = torch.bincount(split.y_train, minlength=10) / 512.0
entropy = -(frequencies * frequencies.log()).sum().item()
assert abs(stationarity["dead-ReLU MLP"].loss - entropy) < 1e-12

# %% tags=["remove-cell"]
for short_name, name in (("dead", "dead-ReLU MLP"), ("trained", "trained tanh MLP")):
    glue_value(f"ch06-sosp-acc-{short_name}", accuracy[name], 3)

# %% [markdown]
# The dead network passes the second-order test at any tolerance above rounding: its
# gradient and its most negative curvature are zero to rounding. It is also useless: it
# predicts the most frequent training class for every image (test accuracy
# {glue:text}`ch06-sosp-acc-dead`) and its loss is the entropy of the class frequencies. The
# trained network fails the test, with a gradient far from zero and a negative Hessian
# eigenvalue, and classifies {glue:text}`ch06-sosp-acc-trained` of the test images correctly.
# Escaping saddles is progress on the objective; whether the objective's stationary points
# are good predictors is a separate question that no local test answers.
#
# M9 follows from the derivation above: on the stable manifold $y = 0$ the gradient's $y$
# component is exactly zero, and off it $|y|$ grows by the factor $1 + \eta$ per step. It
# holds if plain gradient descent stays exactly on $y = 0$ and ends at the saddle (largest
# $|y|$ {glue:text}`ch06-m9-plain-y`, final distance from the saddle
# {glue:text}`ch06-m9-plain-distance`) and every perturbed seed reaches a loss below $-0.2$
# (here {glue:text}`ch06-m9-escaping` of {glue:text}`ch06-m9-seeds`, by step
# {glue:text}`ch06-m9-last-escape` at the latest). The rate of {cite:t}`jin2017escape` bounds
# the number of steps for every dimension; a two-dimensional example cannot test it, so it
# does not enter the status.

# %% tags=["remove-cell"]
plain_distance = float(np.linalg.norm(plain.path[-1]))
plain_on_manifold = bool(np.all(plain.path[:, 1] == 0.0)) and plain_distance < 1e-15
m9_status = "holds" if plain_on_manifold and escaping == len(pgd_runs) else "differs"
glue_value("ch06-m9-plain-y", fmt(float(np.abs(plain.path[:, 1]).max())))
glue_value("ch06-m9-plain-distance", plain_distance, 3)
glue_value("ch06-m9-escaping", escaping)
glue_value("ch06-m9-seeds", len(pgd_runs))
glue_value("ch06-m9-last-escape", max(pgd_escape))
sosp_summary = {name: ("passes" if r.is_second_order_stationary(1e-3, 1e-3) else "fails")
                + f" (test accuracy {fmt(accuracy[name], 3)})" for name, r in stationarity.items()}
ledger.add("M9", "Perturbed gradient descent escapes a strict saddle where plain GD started on the "
           "stable manifold does not",
           f"{escaping} of {len(pgd_runs)} seeds escape (loss $< -0.2$ by step {max(pgd_escape)}); "
           "plain GD converges to the saddle",
           reported="PGD reaches an approximate second-order stationary point in "
                    "$\\tilde O(\\epsilon^{-2})$ steps (jin2017escape)",
           details={"plain GD final loss": float(plain.loss[-1]),
            "PGD seeds escaping": f"{escaping} of {len(pgd_runs)}",
            "PGD steps to loss < -0.2 (min, median, max)":
                [min(pgd_escape), float(np.median(pgd_escape)), max(pgd_escape)],
            "second-order stationarity test (1e-3, 1e-3) on digits": sosp_summary}, sig=3,
           status=m9_status,
           note="a second-order stationary point need not be a good predictor: the dead-ReLU "
                "network passes the test exactly" if m9_status == "holds"
                else "plain GD leaves the stable manifold, or a perturbed seed does not escape")

# %% [markdown]
# ## A gradient step depends on the coordinates
#
# {numref}`Chapter %s <ch-family-of-minima>` showed that the Hessian at a critical point
# transforms as $J^\top H J$ under a reparametrisation $\theta = \varphi(\psi)$ with Jacobian
# $J$. The gradient transforms too, everywhere, by the chain rule:
# $\nabla_\psi (L \circ \varphi) = J^\top \nabla_\theta L$. Take the product model
# $L(a, b) = \tfrac12 (ab - 1)^2$ and the rescaling $(a, b) = (cu, v/c)$:

# %%
a, b, u, v = sp.symbols("a b u v", real=True)
c = sp.symbols("c", positive=True)
product_loss = (a * b - 1) ** 2 / 2
to_ab = {a: c * u, b: v / c}
jacobian = sp.Matrix([c * u, v / c]).jacobian([u, v])

# %% [markdown]
# Sympy checks the chain rule for the gradient:

# %%
grad_ab = sp.Matrix([sp.diff(product_loss, s) for s in (a, b)])
grad_uv = sp.Matrix([sp.diff(product_loss.subs(to_ab), s) for s in (u, v)])
assert sp.simplify(grad_uv - jacobian.T * grad_ab.subs(to_ab)) == sp.zeros(2, 1)
display(Math(r"\nabla_{(u,v)} L = J^\top \nabla_{(a,b)} L,\qquad J = " + sp.latex(jacobian)))

# %% [markdown]
# A gradient step of size $\eta$ taken in $(u, v)$ moves $(a, b)$ by
# $J\,\delta(u, v) = -\eta\, J J^\top \nabla_{(a,b)} L$, which is a different step from
# $-\eta \nabla_{(a,b)} L$ unless $J J^\top = I$:

# %%
mapped_step = jacobian * (-eta * grad_uv)
step_in_ab = -eta * jacobian * jacobian.T * grad_ab.subs(to_ab)
assert sp.simplify(mapped_step - step_in_ab) == sp.zeros(2, 1)
display(Math(r"J J^\top = " + sp.latex(jacobian * jacobian.T)))

# %% [markdown]
# The same statement numerically, at $c = 3$ and $(u, v) = (2, 1)$, that is $(a, b) = (6, 1/3)$,
# with the gradient in $(u, v)$ from torch autograd:

# %%
loss_in_uv = lambda q: product.loss({"a": 3.0 * q["u"], "b": q["v"] / 3.0})
autograd_uv = curvature.closure_gradient(
    loss_in_uv, {"u": torch.tensor(2.0), "v": torch.tensor(1.0)}
)
chain_rule_uv = np.diag([3.0, 1.0 / 3.0]) @ product.gradient(6.0, 1.0 / 3.0)
chain_rule_gap = np.abs(autograd_uv.numpy() - chain_rule_uv).max()
print(
    f"gradient in (a, b): {product.gradient(6.0, 1.0 / 3.0).round(6)}, "
    f"in (u, v): {chain_rule_uv.round(6)}; autograd vs J^T grad: "
    f"{rounding_level(chain_rule_gap)}"
)

# %% [markdown]
# The gradient components are $(1/3, 6)$ in one chart and $(1, 2)$ in the other: a step
# "of length 0.01 along the gradient" has no meaning until the coordinates are named.
#
# **A natural-gradient step.** Steepest descent in a *metric* $F$ takes the step
# $-\eta F^{+} \nabla L$ {cite}`amari1998natural`. For a model with Gaussian outputs of unit
# variance the Fisher metric is $F = \nabla f \, \nabla f^\top$, here with $f = ab$ and
# $\nabla f = (b, a)$; it is singular along the symmetry orbit, so we use the Moore-Penrose
# pseudo-inverse, and sympy checks the two defining identities:

# %%
residual = a * b - 1
grad_f = sp.Matrix([b, a])
fisher = grad_f * grad_f.T
fisher_pinv = fisher / grad_f.dot(grad_f) ** 2
assert sp.simplify(fisher * fisher_pinv * fisher - fisher) == sp.zeros(2, 2)
assert sp.simplify(fisher_pinv * fisher * fisher_pinv - fisher_pinv) == sp.zeros(2, 2)

# %% [markdown]
# To first order a step $\delta$ changes the prediction by $\nabla f^\top \delta$. For the
# Euclidean and the natural step:

# %%
euclidean_change = sp.factor((grad_f.T * (-eta * grad_ab))[0])
natural_change = sp.simplify((grad_f.T * (-eta * fisher_pinv * grad_ab))[0])
assert sp.simplify(natural_change + eta * residual) == 0
display(Math(r"\delta f_{\rm GD} = " + sp.latex(euclidean_change)
             + r",\qquad \delta f_{\rm natural} = " + sp.latex(natural_change)))


# %% [markdown]
# The Euclidean step changes the prediction by $-\eta\,(ab - 1)(a^2 + b^2)$, which grows
# without bound along the orbit; the natural step by $-\eta\,(ab - 1)$ alone, the same
# at every equivalent point and in every chart. We take one real step ($\eta = 0.1$) from
# the equivalent points $(2c, 1/c)$, all predicting 2, with
# `lossgeom_book.noise.natural_gradient_direction` ($F^{+} g$ by `numpy.linalg.pinv`):

# %%
def prediction_after_step(a0, b0, natural, lr=0.1):
    gradient = product.gradient(a0, b0)
    if natural:
        gradient = noise_probes.natural_gradient_direction(gradient, np.outer([b0, a0], [b0, a0]))
    return np.prod(np.array([a0, b0]) - lr * gradient)


# %%
steps_from = {scale: {kind: prediction_after_step(2.0 * scale, 1.0 / scale, kind == "natural")
                      for kind in ("GD", "natural")} for scale in (1.0, 3.0, 10.0)}
for scale, after in steps_from.items():
    print(f"c = {fmt(scale)}: prediction 2 -> {fmt(after['GD'])} (GD), "
          f"{fmt(after['natural'])} (natural)")

# %% [markdown]
# The exact natural step gives $ab - \eta r + \eta^2 r^2\, ab/(a^2 + b^2)^2$ with $r = ab - 1$;
# the second-order remainder still depends on $c$, but only at order $\eta^2$:

# %%
natural_spread = np.ptp([after["natural"] for after in steps_from.values()])
assert natural_spread < 0.1**2 < 1 < np.ptp([after["GD"] for after in steps_from.values()])
for scale, after in steps_from.items():
    a0, b0 = 2.0 * scale, 1.0 / scale
    assert abs(after["natural"] - (2 - 0.1 + 0.01 * a0 * b0 / (a0**2 + b0**2) ** 2)) < 1e-12

# %% tags=["remove-cell"]
glue_value("ch06-natural-spread", natural_spread, 2)


# %% [markdown]
# Across the three equivalent points the natural-gradient predictions differ by
# {glue:text}`ch06-natural-spread`, while plain gradient descent goes from a modest step at
# $c = 1$ to a wild overshoot at $c = 10$. Adam, met again below, can be read as a cheap
# diagonal metric, but it divides by the *square root* of a second moment, so it is not
# invariant even to rescaling one coordinate: its first step is $-\eta$ times the sign of the
# gradient in whatever coordinates it runs, which in $(u, v)$ moves $a$ and $b$ by $c\eta$
# and $\eta/c$. It is invariant to the scale of the loss, not to the chart.
#
# ## Mini-batch gradient noise is anisotropic
#
# Stochastic gradients add noise whose covariance is not isotropic. For mini-batches of
# size $B$ drawn without replacement from $n$ examples with per-example gradient covariance
# $\Sigma$, the covariance of the mini-batch mean is
#
# $$
# \operatorname{Cov}\big(\hat g_B\big) = \frac{n - B}{n - 1}\,\frac{\Sigma}{B} ,
# $$ (eq-ch06-noise)
#
# implemented in `lossgeom_book.noise.projected_noise`, which returns
# $\operatorname{tr}(U^\top \operatorname{Cov}(\hat g_B)\, U)/k$ for an orthonormal
# $n_{\rm params} \times k$ basis $U$. We measure it for the digits network at initialisation
# and after the 200 training steps above, in two subspaces: the top-10 Hessian eigenvectors
# of the full training loss, computed by Lanczos on Hessian-vector products
# (`lossgeom.curvature.top_eigenpairs`), and a random
# 10-dimensional subspace (QR of a seeded Gaussian matrix):

# %%
def noise_subspaces(params, k=10, seed=0):
    eig = curvature.top_eigenpairs(curvature.HessianOperator.from_closure(full_loss, params), k=k, seed=seed)
    assert np.max(eig.residuals) <= 1e-6 * abs(eig.values[0])
    gaussian = torch.from_numpy(np.random.default_rng(seed).standard_normal(eig.vectors.shape))
    return torch.from_numpy(np.ascontiguousarray(eig.vectors)), torch.linalg.qr(gaussian)[0]


# %% [markdown]
# For each checkpoint we compute the 512 per-example gradients once, and both subspaces:

# %%
checkpoints = {"initialisation": theta0, "after 200 steps": warm.params}
per_example = {label: training.closure_per_example_gradients(batch_loss, p, 512)
               for label, p in checkpoints.items()}
subspaces = {label: noise_subspaces(p) for label, p in checkpoints.items()}

# %% [markdown]
# Then formula {eq}`eq-ch06-noise` at three batch sizes:

# %%
batch_sizes = (8, 32, 128)
noise = {(label, B, which): noise_probes.projected_noise(per_example[label], basis, B)
         for label in checkpoints for B in batch_sizes
         for which, basis in zip(("top", "random"), subspaces[label])}

# %%
for label in checkpoints:
    print(f"{label}: variance per direction, top-10 Hessian / random = " + ", ".join(
        f"{fmt(noise[(label, B, 'top')], 4)} / {fmt(noise[(label, B, 'random')], 4)} (B = {B})"
        for B in batch_sizes))

# %% [markdown]
# The noise along the top Hessian directions is many times the noise along random
# directions, at both checkpoints, and each variance falls like $1/B$ (times the
# finite-population factor of {eq}`eq-ch06-noise`), so their *ratio* does not depend on the
# batch size. Formula {eq}`eq-ch06-noise` is exact for sampling without replacement, if it
# is implemented right; we test the implementation by drawing 4,000 seeded mini-batches of
# each size at the trained checkpoint (`lossgeom_book.noise.sampled_batch_noise`) and
# comparing their variance with the formula, with the standard error of the sampled value:

# %%
trained_gradients = per_example["after 200 steps"]
trained_top, trained_random = subspaces["after 200 steps"]
sampled = {B: noise_probes.sampled_batch_noise(trained_gradients, trained_top, B, 4000, seed=1)
           for B in batch_sizes}
per_draw = {B: (s**2).mean(axis=1) for B, s in sampled.items()}

# %% [markdown]
# The sampled variance is the mean of the per-draw squared noise, and its standard error
# follows from the spread of those draws:

# %%
formula = {B: noise[("after 200 steps", B, "top")] for B in batch_sizes}
sampled_gap = {B: per_draw[B].mean() / formula[B] - 1 for B in batch_sizes}
standard_error = {B: per_draw[B].std(ddof=1) / np.sqrt(4000) / per_draw[B].mean()
                  for B in batch_sizes}

# %%
assert all(abs(sampled_gap[B]) < 4 * standard_error[B] for B in batch_sizes)
for B in batch_sizes:
    print(f"B = {B:3d}: sampled / formula - 1 = {fmt(sampled_gap[B], 2)} "
          f"(standard error of the sampled value {fmt(standard_error[B], 2)})")

# %% [markdown]
# Every sampled variance agrees with the formula within a few standard errors, so the
# numbers above are the variances SGD actually sees. The ratio of the two subspaces' variances
# at $B = 32$, at each checkpoint:

# %%
ratios = {label: noise[(label, 32, "top")] / noise[(label, 32, "random")] for label in checkpoints}

# %% tags=["remove-cell"]
for label, short_name in (("initialisation", "init"), ("after 200 steps", "trained")):
    glue_value(f"ch06-noise-ratio-{short_name}", ratios[label], 3)


# %% [markdown]
# At $B = 32$ the top-Hessian variance exceeds the random-subspace variance by a factor of
# {glue:text}`ch06-noise-ratio-init` at initialisation and
# {glue:text}`ch06-noise-ratio-trained` after training: noise is concentrated where
# curvature is high. This is a measurement on one small network, not a law.
#
# **Batch size changes where SGD goes.** {cite:t}`keskar2017large` associated large batches
# with sharper minima, and {cite:t}`jastrzebski2019relation` measured that the sharpness
# SGD visits depends jointly on the learning rate and the batch size. We hold the learning
# rate at 0.5 and the number of updates at 600 (the same deterministic step scale and
# "time"; larger batches then process more examples), train plain SGD from three seeds at
# each batch size up to the full training set, and measure the final top Hessian eigenvalue:

# %%
def sharpness(loss, params):
    operator = curvature.HessianOperator.from_closure(lambda p: loss(p, None), params)
    return float(curvature.top_eigenpairs(operator, k=1, seed=0).values[0])


# %%
def sgd_endpoint(batch_size, seed, lr=0.5, steps=600):
    model = mlp([64, 16, 10], "tanh", seed=seed)
    loss = training.indexed_loss(model, nn.CrossEntropyLoss(), (split.x_train, split.y_train))
    full_batch = batch_size == 512
    batches = None if full_batch else training.batch_schedule(512, batch_size, steps, seed=seed)
    run = training.train(loss, params_of(model), training.sgd(lr), steps,
                           batches=batches)
    return {"loss": loss(run.params, None).item(), "sharpness": sharpness(loss, run.params)}


# %%
sweep_batch_sizes, sweep_seeds = (8, 32, 128, 512), (0, 1, 2)
endpoints = {(B, s): sgd_endpoint(B, s) for B in sweep_batch_sizes for s in sweep_seeds}
by_batch = {B: {k: [endpoints[(B, s)][k] for s in sweep_seeds] for k in ("loss", "sharpness")}
            for B in sweep_batch_sizes}

# %% [markdown]
# Three seeds give a median and a range; we print three significant digits, which is what a
# 600-step run resolves:

# %%
for B, r in by_batch.items():
    print(f"B = {B:3d}: top Hessian eigenvalue median {fmt(np.median(r['sharpness']), 3)} "
          f"(range {fmt(min(r['sharpness']), 3)}-{fmt(max(r['sharpness']), 3)}), "
          f"training loss median {fmt(np.median(r['loss']), 3)}")

# %%
median_sharpness = [np.median(by_batch[B]["sharpness"]) for B in sweep_batch_sizes]
assert max(max(r["sharpness"]) for r in by_batch.values()) < 2 / 0.5  # below 2 / eta
assert np.all(np.diff(median_sharpness) > 0)

# %% tags=["remove-cell"]
glue_value("ch06-sharp-b8", median_sharpness[0], 3)
glue_value("ch06-sharp-full", median_sharpness[-1], 3)

# %% [markdown]
# At the same learning rate and number of steps, the median final sharpness rises with the
# batch size, from {glue:text}`ch06-sharp-b8` at $B = 8$ to {glue:text}`ch06-sharp-full` for
# full-batch gradient descent, while the training losses are similar (the small-batch runs
# end slightly *higher*, so the lower sharpness is not a by-product of a lower loss). All
# these values lie far below the stability limit $2/\eta = 4$: it is the noise, not the
# step-size limit, that keeps small-batch SGD in flatter regions here. The figure
# shows the noise and the endpoints:

# %% tags=["hide-input"]
noise_contract = MeasurementContract(
    centre="tanh MLP 64-16-10, seed 0: at initialisation and after 200 momentum-SGD steps",
    directions="top-10 Hessian eigenvectors (Lanczos) vs a random orthonormal 10-dim basis",
    normalisation="orthonormal bases; variance per basis direction",
    radius="n/a (covariance at a point)", loss="cross-entropy",
    reduction="mean over the mini-batch",
    data="512 training digits (sklearn, seed 0)",
    model_mode="n/a (no dropout or batch norm)",
    resolution="batch sizes 8, 32, 128 (left); 8, 32, 128, 512 x 3 seeds, SGD lr 0.5, 600 steps "
               "(right)",
    precision="float64")
fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.4), layout="constrained")
for label, marker in (("initialisation", "o"), ("after 200 steps", "s")):
    for which, style in (("top", "-"), ("random", "--")):
        axes[0].loglog(batch_sizes, [noise[(label, B, which)] for B in batch_sizes], marker + style,
                       label=f"{'top-10 Hessian' if which == 'top' else 'random'}, {label}")
axes[0].set_xlabel("batch size B")
axes[0].set_ylabel("gradient-noise variance per direction")
axes[0].legend(fontsize=7)
for B in sweep_batch_sizes:
    axes[1].semilogx([B] * len(sweep_seeds), by_batch[B]["sharpness"], "o", color="C0", alpha=0.6)
axes[1].semilogx(sweep_batch_sizes, median_sharpness, "-", color="C0", label="median over 3 seeds")
axes[1].set_xlabel("batch size B (512 = full batch)")
axes[1].set_ylabel("final top Hessian eigenvalue")
axes[1].legend(fontsize=8)
glue_figure("ch06-noise", fig, noise_contract,
            "Left: variance of the mini-batch gradient on the top Hessian eigenvectors and on a "
            "random subspace. "
            "Right: final sharpness of plain SGD against batch size at a fixed learning rate")

# %% [markdown]
# ```{glue:figure} fig-ch06-noise
# :name: fig-ch06-noise
#
# {glue:text}`cap-ch06-noise`
#
# {glue:md}`con-ch06-noise`
# ```
#
# {numref}`fig-ch06-noise` shows the two subspaces separated by the same factor at every
# batch size (left), and the endpoint sharpness growing with the batch (right).
#
# ## Momentum and adaptive scaling reshape the noise
#
# The variance above is what one mini-batch gradient carries. An optimiser does not apply it
# as it is. Heavy-ball momentum accumulates $v_t = \mu v_{t-1} + \hat g_t$: for independent
# noise of covariance $C$ the stationary covariance $S$ of $v$ solves $S = \mu^2 S + C$, and
# consecutive velocities are correlated by $\mu$. So
#
# $$
# S = \frac{C}{1 - \mu^2}, \qquad
# \frac{1/(1 - \mu)}{1/\sqrt{1 - \mu^2}} = \sqrt{\frac{1 + \mu}{1 - \mu}} ,
# $$
#
# where the second expression compares the gain $1/(1 - \mu)$ of the mean gradient with the
# gain of the noise's standard deviation. Sympy solves for $S$ and checks the ratio:

# %%
mu, gain = sp.symbols("mu s", real=True)
noise_gain = sp.solve(sp.Eq(gain, mu**2 * gain + 1), gain)[0]
assert sp.simplify(noise_gain - 1 / (1 - mu**2)) == 0
assert sp.simplify((1 / (1 - mu)) ** 2 / noise_gain - (1 + mu) / (1 - mu)) == 0

# %% tags=["remove-cell"]
glue_value("ch06-noise-sd-gain", float(sp.sqrt(noise_gain.subs(mu, sp.Rational(9, 10)))), 2)

# %% [markdown]
# At $\mu = 0.9$ momentum amplifies the mean gradient by $1/(1 - \mu) = 10$ but the noise's
# standard deviation only by $1/\sqrt{1 - \mu^2} =$ {glue:text}`ch06-noise-sd-gain`, and
# spreads it over about $1/(1 - \mu)$ correlated steps. We
# check both on the sampled $B = 32$ mini-batch noise at the trained checkpoint, dropping the
# first 200 velocities (the start-up transient):

# %%
velocity = noise_probes.heavy_ball_velocity(sampled[32], 0.9)[200:]
variance_gain = (velocity**2).mean() / (sampled[32] ** 2).mean()
lag_one = np.mean((velocity[1:] * velocity[:-1]).mean(0) / (velocity**2).mean(0))
print(f"momentum 0.9: noise variance gain {fmt(variance_gain, 3)} "
      f"(derived {fmt(1 / (1 - 0.81), 3)}), "
      f"lag-1 autocorrelation {fmt(lag_one, 3)} (derived 0.9)")

# %% [markdown]
# Adam instead divides each coordinate by the root of its second-moment buffer, which at a
# fixed point tends to $\mathbb{E}[\hat g_B^2] = g^2 + \operatorname{Var}(\hat g_B)$
# coordinate-wise (`lossgeom_book.noise.adam_preconditioner`). Its update noise is that
# diagonal times the mini-batch noise; we measure it in the same two subspaces:

# %%
adam_scaling = noise_probes.adam_preconditioner(trained_gradients, 32)
preconditioned = {which: noise_probes.projected_noise(trained_gradients, basis, 32, adam_scaling)
                  for which, basis in (("top", trained_top), ("random", trained_random))}
adam_ratio = preconditioned["top"] / preconditioned["random"]
print(f"top-10 / random noise variance at B = 32: SGD {fmt(ratios['after 200 steps'], 3)}, "
      f"Adam-scaled {fmt(adam_ratio, 3)}")

# %%
assert abs(variance_gain * (1 - 0.81) - 1) < 0.1 and abs(lag_one - 0.9) < 0.02
assert adam_ratio < ratios["after 200 steps"]

# %% tags=["remove-cell"]
glue_value("ch06-adam-noise-ratio", adam_ratio, 3)

# %% [markdown]
# Momentum keeps the direction of the noise and changes its timing: larger, slower swings
# that add up over about $1/(1 - \mu)$ steps. Adam changes its direction: after its
# coordinate-wise scaling the top-Hessian subspace carries
# {glue:text}`ch06-adam-noise-ratio` times the random subspace's variance instead of
# {glue:text}`ch06-noise-ratio-trained` (the scaling shrinks most the coordinates whose
# gradients are largest, and here that takes noise out of the sharp directions relative to a
# random subspace). "SGD is noisy" is therefore less
# informative than saying which directions each update rule fills with noise.
#
# M10 holds at our scale if three parts do. Formula {eq}`eq-ch06-noise` agrees with the
# sampled batches within four standard errors at each batch size (the largest distance here is
# {glue:text}`ch06-m10-largest-z` standard errors). The noise is anisotropic: the top-10 Hessian
# subspace carries more variance than the random one at both checkpoints (a ratio above 1,
# which isotropic noise gives exactly; here {glue:text}`ch06-noise-ratio-init` and
# {glue:text}`ch06-noise-ratio-trained`). And the final sharpness rises with the batch size:
# the median at every step of the sweep, and every full-batch seed above every $B = 8$ seed
# (the smallest full-batch value is {glue:text}`ch06-m10-full-low`, the largest at $B = 8$
# {glue:text}`ch06-m10-b8-high`). {cite:t}`keskar2017large` state a direction, not a level.

# %% tags=["remove-cell"]
largest_z = max(abs(sampled_gap[B]) / standard_error[B] for B in batch_sizes)
m10_parts = {"formula": largest_z <= 4, "anisotropic": min(ratios.values()) > 1,
             "sharper with batch": bool(np.all(np.diff(median_sharpness) > 0))
             and min(by_batch[512]["sharpness"]) > max(by_batch[8]["sharpness"])}
effect_seen = m10_parts["anisotropic"] or m10_parts["sharper with batch"]
m10_status = ("holds at our scale" if all(m10_parts.values())
              else "differs" if effect_seen else "not reproduced")
glue_value("ch06-m10-largest-z", largest_z, 2)
glue_value("ch06-m10-full-low", min(by_batch[512]["sharpness"]), 3)
glue_value("ch06-m10-b8-high", max(by_batch[8]["sharpness"]), 3)
ledger.add("M10", "Mini-batch gradient noise is anisotropic: its covariance projected onto Hessian "
           "eigenvectors, and how batch size changes it",
           f"top-10 Hessian / random noise variance at $B = 32$: {fmt(ratios['initialisation'], 3)} "
           f"(initialisation), {fmt(ratios['after 200 steps'], 3)} (trained)",
           reported="large batches tend to reach sharper minima (keskar2017large)",
           details={"top-10 / random variance at B=32 (initialisation, trained)": list(ratios.values()),
            "sampled (4000 batches) / formula - 1 at B = 8, 32, 128": list(sampled_gap.values()),
            "standard error of the sampled value": list(standard_error.values()),
            "SGD lr 0.5, 600 steps: median final top eigenvalue, B = 8, 32, 128, 512":
                median_sharpness,
            "momentum 0.9: sampled noise variance gain, derived 1/(1 - mu^2)":
                [variance_gain, 1 / 0.19],
            "top-10 / random variance after Adam's scaling (B=32)": adam_ratio},
           status=m10_status, sig=3,
           note="one 1,210-parameter tanh MLP on 512 digits; the formula is checked against "
                "sampled batches; the batch-size sweep matches steps and learning rate, 3 seeds")

# %% [markdown]
# ## Decoupled weight decay and L2 regularisation
#
# L2 regularisation adds $\tfrac{\lambda'}{2}\lVert\theta\rVert^2$ to the loss, so its
# gradient $\lambda'\theta$ passes through the optimiser. Decoupled weight decay
# {cite}`loshchilov2019decoupled` shrinks the weights outside the optimiser:
# $\theta \leftarrow (1 - \lambda)\theta - (\text{optimiser step})$. For plain SGD sympy
# finds the exact condition under which the two updates agree for every $\theta$ and $g$:

# %%
theta, g, lam, lam_l2 = sp.symbols("theta g lambda lambda'", real=True)
sgd_l2 = theta - eta * (g + lam_l2 * theta)
sgd_decoupled = (1 - lam) * theta - eta * g
match = sp.solve(sp.Poly(sp.expand(sgd_l2 - sgd_decoupled), theta, g).coeffs(), lam_l2, dict=True)
assert match == [{lam_l2: lam / eta}]

# %%
assert sp.simplify((sgd_l2 - sgd_decoupled).subs(lam_l2, lam / eta)) == 0
display(Math(r"\theta - \eta(g + \lambda'\theta) \equiv (1 - \lambda)\theta - \eta g"
             r"\iff \lambda' = " + sp.latex(match[0][lam_l2])))

# %% [markdown]
# So the two coincide exactly when the L2 coefficient is $\lambda' = \lambda/\eta$: the
# decoupled rate divided by the learning rate. (`torch.optim.AdamW` and
# `lossgeom.training` write the decoupled shrinkage as $1 - \eta\lambda_{\rm wd}$, in which
# convention the same statement reads $\lambda_{\rm wd} = \lambda'$.) Already heavy-ball
# momentum breaks the identity: over two steps, with the L2 gradient inside the velocity
# and the decay outside it, the results differ by a term proportional to $\mu$:

# %%
g0, g1 = sp.symbols("g_0 g_1", real=True)
velocity_1 = g0 + lam_l2 * theta
theta_1 = theta - eta * velocity_1
l2_two_steps = theta_1 - eta * (mu * velocity_1 + g1 + lam_l2 * theta_1)

# %%
decoupled_1 = (1 - lam) * theta - eta * g0
decoupled_two_steps = (1 - lam) * decoupled_1 - eta * (mu * g0 + g1)
momentum_gap = sp.factor(sp.simplify((l2_two_steps - decoupled_two_steps).subs(lam_l2, lam / eta)))
assert sp.simplify(momentum_gap - (-mu * lam * theta)) == 0
display(Math(r"\theta_2^{\rm L2} - \theta_2^{\rm decoupled}\big|_{\lambda' = \lambda/\eta} = "
             + sp.latex(momentum_gap)))

# %% [markdown]
# Under Adam the L2 gradient is divided by the adaptive denominator, which decoupled decay
# never sees. The first Adam step from a zero state (with $\epsilon = 0$) makes the point
# in one line: for $g, \theta > 0$ the L2 step does not depend on $\lambda'$ at all,
# because Adam normalises the regularised gradient to unit size, so no choice of
# $\lambda'$ reproduces decoupled decay. The symbols are positive versions of the ones above:

# %%
g_pos, theta_pos, lam_pos, lam_l2_pos = sp.symbols("g theta lambda lambda'", positive=True)
regularised = g_pos + lam_l2_pos * theta_pos
adam_l2 = theta_pos - eta_pos * regularised / sp.sqrt(regularised**2)
adam_decoupled = (1 - lam_pos) * theta_pos - eta_pos * g_pos / sp.sqrt(g_pos**2)

# %%
assert sp.simplify(adam_l2 - (theta_pos - eta_pos)) == 0
assert sp.solve(sp.Eq(adam_l2, adam_decoupled), lam_l2_pos) == []
display(Math(r"\text{Adam + L2: } \theta_1 = " + sp.latex(sp.simplify(adam_l2))
             + r",\qquad \text{AdamW: } \theta_1 = " + sp.latex(sp.expand(adam_decoupled))))

# %% [markdown]
# The package's update rules follow the same algebra; its tests check the plain-SGD identity,
# the two inequalities, and every rule against `torch.optim.SGD`, `Adam` and `AdamW` step by
# step. A numeric confirmation on the digits network, 30 steps with the L2 and the
# decoupled form of each rule:

# %%
short_schedule = training.batch_schedule(512, 32, 30, seed=3)
def decay_gap(make):
    coupled, decoupled = (training.train(batch_loss, theta0, make(flag), 30,
                                           batches=short_schedule).params for flag in (False, True))
    return max((coupled[n] - decoupled[n]).abs().max().item() for n in coupled)


# %%
decay_gaps = {"SGD": decay_gap(lambda d: training.sgd(0.1, 0.0, 0.01, decoupled=d)),
              "momentum SGD": decay_gap(lambda d: training.sgd(0.1, 0.9, 0.01, decoupled=d)),
              "Adam": decay_gap(lambda d: training.adam(0.01, weight_decay=0.01, decoupled=d))}
assert decay_gaps["momentum SGD"] > 1e-5 and decay_gaps["Adam"] > 1e-5
print(f"largest parameter difference, L2 vs decoupled, 30 steps: "
      f"SGD {rounding_level(decay_gaps['SGD'])}, "
      f"momentum SGD {fmt(decay_gaps['momentum SGD'], 3)}, Adam {fmt(decay_gaps['Adam'], 3)}")

# %% [markdown]
# For plain SGD the two forms differ only by the order of rounding; with momentum or Adam
# they are different algorithms.
#
# ### A matched AdamW versus momentum-SGD comparison
#
# The source's protocol for comparing two update rules fixes everything but the rule. At
# our scale: the same network (tanh MLP 64-16-10), initialisations (seeds 0, 1, 2), training
# set (512 digits) and test set (500 digits); batch size 32 and 200 steps for both, so equal
# processed examples (6,400, 12.5 epochs) and equal gradient evaluations (200); decoupled
# weight decay with the *same per-step shrinkage* $1 - 10^{-4}$ for both; the same tuning
# budget, four learning rates on a factor-$\sqrt{10}$ grid each, chosen by final training
# loss on seed 0, with grids wide enough that the chosen rate is interior; and a declared
# endpoint rule: compare each run at the first checkpoint (every 20 steps) where its full
# training loss is at or below a common target, the largest final loss of the six chosen
# runs, so that both optimisers are compared at matched training loss. The settings:

# %%
SHRINK, STEPS, BATCH, SEEDS = 1e-4, 200, 32, (0, 1, 2)
GRID = {"momentum SGD": (0.03, 0.1, 0.3, 1.0), "AdamW": (0.003, 0.01, 0.03, 0.1)}
def make_optimiser(name, lr):
    if name == "AdamW":
        return training.adam(lr, weight_decay=SHRINK / lr, decoupled=True)
    return training.sgd(lr, momentum=0.9, weight_decay=SHRINK / lr, decoupled=True)


# %% [markdown]
# One training run records the full training loss and the parameters every 20 steps
# (`lossgeom.training.closure_checkpoint_monitor`):

# %%
def trained(name, lr, seed):
    model = mlp([64, 16, 10], "tanh", seed=seed)
    loss = training.indexed_loss(model, nn.CrossEntropyLoss(), (split.x_train, split.y_train))
    run = training.train(loss, params_of(model), make_optimiser(name, lr), STEPS,
                           batches=training.batch_schedule(512, BATCH, STEPS, seed=seed),
                           monitor=training.closure_checkpoint_monitor(loss), monitor_every=20)
    return model, loss, run


# %% [markdown]
# The tuning runs, four per optimiser on seed 0:

# %%
tuning = {(name, lr): trained(name, lr, 0) for name, lrs in GRID.items() for lr in lrs}
final_loss = {key: run.monitored[-1][1][0] for key, (_, _, run) in tuning.items()}
chosen = {name: min(lrs, key=lambda lr: final_loss[(name, lr)]) for name, lrs in GRID.items()}
assert all(lrs[0] < chosen[name] < lrs[-1] for name, lrs in GRID.items())  # interior optimum

# %% [markdown]
# A run whose full training loss rose at three or more of its ten checkpoints oscillates. Its
# loss curve is then chaotic: multiplying the initial weights by $1 + 10^{-14}$ changes it by
# order one, as the cell below checks for momentum SGD at learning rate 1.0:

# %%
oscillating_model, oscillating_loss, oscillating_run = tuning[("momentum SGD", 1.0)]
nudged = {k: v * (1 + 1e-14) for k, v in params_of(oscillating_model).items()}
rerun = training.train(oscillating_loss, nudged, make_optimiser("momentum SGD", 1.0), STEPS,
                         batches=training.batch_schedule(512, BATCH, STEPS, seed=0),
                         monitor=training.closure_checkpoint_monitor(oscillating_loss), monitor_every=20)
curve_change = max(abs(first[0] - second[0])
                   for (_, first), (_, second) in zip(oscillating_run.monitored, rerun.monitored))

# %% [markdown]
# So for such a run we report the event, not the number:

# %%
checkpoint_losses = {key: [m[0] for _, m in run.monitored] for key, (_, _, run) in tuning.items()}
unstable = {key: int(np.sum(np.diff(losses) > 0)) >= 3 for key, losses in checkpoint_losses.items()}
assert curve_change > 0.1 and unstable[("momentum SGD", 1.0)]
for (name, lr), value in final_loss.items():
    shown = "unstable (rose at 3 or more checkpoints)" if unstable[(name, lr)] else fmt(value, 3)
    marker = "  <- chosen" if chosen[name] == lr else ""
    print(f"{name:12} lr {fmt(lr):5}: final training loss {shown}{marker}")

# %% [markdown]
# Each grid now brackets its optimum: the next larger rate trains worse, and for momentum SGD
# at learning rate 1.0 the training is unstable. Each chosen learning rate is then
# run on all three seeds, and every run is read at its first checkpoint below the common
# target:

# %%
runs = {(name, s): tuning[(name, chosen[name])] if s == 0 else trained(name, chosen[name], s)
        for name in GRID for s in SEEDS}
target = max(run.monitored[-1][1][0] for _, _, run in runs.values())


# %%
def at_target(model, loss, run):
    step, value, params = training.checkpoints.first_checkpoint_below(run, target)
    return {
        "step": step,
        "loss": value,
        "test accuracy": models.accuracy(model, test_data, params=params),
        "top eigenvalue": sharpness(loss, params),
    }


matched = {key: at_target(*value) for key, value in runs.items()}

# %%
print(f"common target training loss: {fmt(target, 3)}")
for (name, s), r in matched.items():
    print(f"{name:12} seed {s}: step {r['step']:3d}, loss {fmt(r['loss'], 3)}, "
          f"test accuracy {fmt(r['test accuracy'], 3)}, "
          f"top Hessian eigenvalue {fmt(r['top eigenvalue'], 3)}")

# %% [markdown]
# Averaged over the three seeds:

# %%
summary = {name: {k: float(np.mean([matched[(name, s)][k] for s in SEEDS]))
                  for k in ("step", "test accuracy", "top eigenvalue")} for name in GRID}
for name, m in summary.items():
    print(f"{name:12}: mean step {fmt(m['step'], 3)}, "
          f"mean test accuracy {fmt(m['test accuracy'], 3)}, "
          f"mean top eigenvalue {fmt(m['top eigenvalue'], 3)}")

# %% tags=["remove-cell"]
glue_value("ch06-target", target, 3)
for name, key in (("AdamW", "adamw"), ("momentum SGD", "sgd")):
    glue_value(f"ch06-acc-{key}", summary[name]["test accuracy"], 3)
    glue_value(f"ch06-sharp-{key}", summary[name]["top eigenvalue"], 3)
    glue_value(f"ch06-lr-{key}", chosen[name], 3)

# %% [markdown]
# With learning rates {glue:text}`ch06-lr-adamw` (AdamW) and {glue:text}`ch06-lr-sgd`
# (momentum SGD), at the matched training loss {glue:text}`ch06-target`, AdamW reaches mean
# test accuracy {glue:text}`ch06-acc-adamw` with mean top Hessian eigenvalue
# {glue:text}`ch06-sharp-adamw`, and momentum SGD {glue:text}`ch06-acc-sgd` with
# {glue:text}`ch06-sharp-sgd`. Three seeds on a thousand-parameter network support only
# a descriptive statement about this protocol; the point of the section is the protocol
# (what is held equal and how the endpoint is chosen), which scales unchanged to larger
# models. A top eigenvalue compared between two optimisers is also subject to everything
# {numref}`Chapter %s <ch-family-of-minima>` says about parametrisation: both runs use the
# same architecture and coordinates, which is what makes the comparison meaningful at all.
#
# M14's derivation is exact, and the runs confirm it if the L2 and decoupled forms of plain
# SGD differ only by rounding (here {glue:text}`ch06-m14-sgd-gap`) while those of momentum SGD
# and Adam differ by more than $10^{-5}$ (here {glue:text}`ch06-m14-momentum-gap` and
# {glue:text}`ch06-m14-adam-gap`). Its comparison holds at our scale if the declared protocol
# is met: budgets, shrinkage and endpoint rule are equal by construction, and what is measured
# is that each chosen learning rate ({glue:text}`ch06-lr-adamw` and {glue:text}`ch06-lr-sgd`)
# lies strictly inside its four-point grid, so that the tuning budget brackets each optimum.
# The source's scenario is synthetic and states no level and no winner, so the accuracies and
# eigenvalues above are descriptive and do not enter the status.

# %% tags=["remove-cell"]
derivation_confirmed = (decay_gaps["SGD"] < 1e-13
                        and min(decay_gaps["momentum SGD"], decay_gaps["Adam"]) > 1e-5)
protocol_met = all(lrs[0] < chosen[name] < lrs[-1] for name, lrs in GRID.items())
m14_status = "holds at our scale" if derivation_confirmed and protocol_met else "differs"
glue_value("ch06-m14-sgd-gap", rounding_level(decay_gaps["SGD"]))
glue_value("ch06-m14-momentum-gap", decay_gaps["momentum SGD"], 3)
glue_value("ch06-m14-adam-gap", decay_gaps["Adam"], 3)
ledger.add("M14", "Decoupled weight decay equals L2 only for plain SGD (derived); matched AdamW vs "
           "momentum-SGD comparison",
           f"SGD: equal iff $\\lambda' = {sp.latex(match[0][lam_l2])}$, momentum: off by "
           f"${sp.latex(momentum_gap)}$; accuracy {fmt(summary['AdamW']['test accuracy'], 3)} "
           f"(AdamW), {fmt(summary['momentum SGD']['test accuracy'], 3)} (SGD)",
           reported="equal for SGD with $\\lambda' = \\lambda/\\eta$, not for Adam "
                    "(loshchilov2019decoupled)",
           details={"SGD identity": "lambda' = lambda / eta (sympy)",
            "two-step momentum gap": momentum_gap,
            "Adam + L2 first step": "independent of lambda' (sympy)",
            "chosen lr (AdamW, momentum SGD), interior of 4-point grids":
                [chosen["AdamW"], chosen["momentum SGD"]],
            "next larger lr (AdamW 0.1, momentum SGD 1.0): final loss":
                [final_loss[("AdamW", 0.1)], "unstable (oscillates)"],
            "matched loss target": target,
            "mean test accuracy (AdamW, momentum SGD)":
                [summary["AdamW"]["test accuracy"], summary["momentum SGD"]["test accuracy"]],
            "mean top Hessian eigenvalue (AdamW, momentum SGD)":
                [summary["AdamW"]["top eigenvalue"], summary["momentum SGD"]["top eigenvalue"]]},
           status=m14_status, sig=3,
           note="derivation exact; comparison on a 1,210-parameter MLP, 512 digits, 3 seeds, "
                "4 learning rates each (grids extended until the chosen rate is interior)")

# %% [markdown]
# ## Optimiser, sampler and precision state are part of the trajectory
#
# A checkpoint that stores only the weights does not store the dynamical system. We train
# for 100 steps, save the weights *and* the optimiser state, and continue for 30 more steps
# in four ways: with everything restored; from the weights alone (fresh zero moments and
# step counter); with the optimiser state but a sampler restarted with another seed (the
# data loader's position and random state not saved); and from a checkpoint written in
# single precision (weights and buffers rounded to float32, an exact and machine-independent
# rounding, `lossgeom_book.noise.stored_at_precision`). `lossgeom.training.closure_parameter_path`
# records the flattened weights after every step:

# %%
resume_schedule = training.batch_schedule(512, 32, 130, seed=5)
restarted_sampler = training.batch_schedule(512, 32, 30, seed=6)
def continuations(opt):
    checkpoint = training.train(batch_loss, theta0, opt, 100, batches=resume_schedule)
    single = noise_probes.stored_at_precision(checkpoint.params, checkpoint.state, torch.float32)
    cases = {"full state": (checkpoint.params, checkpoint.state, resume_schedule[100:]),
             "weights only": (checkpoint.params, None, resume_schedule[100:]),
             "sampler restarted": (checkpoint.params, checkpoint.state, restarted_sampler),
             "stored in float32": (*single, resume_schedule[100:])}
    return {case: training.closure_parameter_path(batch_loss, params, opt, batches, state)
            for case, (params, state, batches) in cases.items()}


# %% [markdown]
# We apply it to AdamW (learning rate 0.01) and momentum SGD (learning rate 0.1), and check
# that the full resume reproduces the uninterrupted 130-step run:

# %%
resume_optimisers = {"AdamW": training.adam(0.01, weight_decay=0.01),
                     "momentum SGD": training.sgd(0.1, momentum=0.9)}
resume = {name: continuations(opt) for name, opt in resume_optimisers.items()}
uninterrupted = {name: training.closure_parameter_path(batch_loss, theta0, opt, resume_schedule)[100:]
                 for name, opt in resume_optimisers.items()}

# %%
resume_exact = max((resume[n]["full state"] - uninterrupted[n]).abs().max().item() for n in resume)
assert resume_exact == 0.0
distance = {name: {case: (path - paths["full state"]).norm(dim=1) for case, path in paths.items()
                   if case != "full state"} for name, paths in resume.items()}

# %%
for name, cases in distance.items():
    for case, d in cases.items():
        print(f"{name:12} {case:17}: |theta - theta_full| after k = 0, 1, 10, 30 steps: "
              + ", ".join(fmt(d[k].item(), 2) for k in (0, 1, 10, 30)))

# %% [markdown]
# The distance the full AdamW run travels in those 30 steps sets the scale:

# %%
travelled = (resume["AdamW"]["full state"][30] - resume["AdamW"]["full state"][0]).norm().item()

# %% tags=["remove-cell"]
adamw_gaps = {case: d.tolist() for case, d in distance["AdamW"].items()}
resume_values = {"ch06-resume-adam-1": adamw_gaps["weights only"][1],
                 "ch06-resume-adam-30": adamw_gaps["weights only"][30],
                 "ch06-resume-adam-travel": travelled,
                 "ch06-float32-adam-0": adamw_gaps["stored in float32"][0],
                 "ch06-float32-adam-30": adamw_gaps["stored in float32"][30]}
for name, value in resume_values.items():
    glue_value(name, value, 2)

# %% [markdown]
# Resuming with the full state reproduces the uninterrupted run bit for bit. Resuming from
# the weights alone does not: Adam's first step from zero moments is, by the bias
# correction, a step of about $\eta$ in *every* coordinate (the sign of the gradient), far
# larger than the steps the trained moments were taking, so after one step the two runs are
# already {glue:text}`ch06-resume-adam-1` apart and after 30 steps
# {glue:text}`ch06-resume-adam-30`, compared with {glue:text}`ch06-resume-adam-travel`
# travelled by the full run in those steps. A restarted sampler feeds different examples from
# the first step on, so the run leaves the original one at once, for both optimisers.
# The float32 checkpoint starts {glue:text}`ch06-float32-adam-0` away (rounding only) and is
# {glue:text}`ch06-float32-adam-30` away after 30 AdamW steps: a different trajectory, though
# here the gap neither grows nor shrinks; the source's warning about precision paths concerns
# loss scaling and overflow in low-precision training, which this float64 continuation does not
# exercise.

# %% tags=["hide-input"]
resume_contract = noise_contract.with_(
    centre="the 100-step checkpoint of each optimiser (seed 0)",
    directions="n/a (distance between two trajectories)",
    normalisation="Euclidean norm of the flattened parameter difference from the full-state resume",
    radius="30 steps after the checkpoint",
    resolution="every step; mini-batches of seed 5 (restarted sampler: seed 6)")
fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.4), sharey=True, layout="constrained")
for ax, (name, cases) in zip(axes, distance.items()):
    for case, d in cases.items():
        ax.semilogy(np.arange(1, 31), d[1:].numpy(), label=case)
    ax.set_title(name)
    ax.set_xlabel("steps k after resuming")
axes[0].set_ylabel("distance from the full-state resume")
axes[0].legend(fontsize=8)
glue_figure("ch06-resume", fig, resume_contract,
            "Distance from the full-state continuation when a checkpoint is resumed without its "
            "optimiser state, with a restarted sampler, or from float32 storage")

# %% [markdown]
# ```{glue:figure} fig-ch06-resume
# :name: fig-ch06-resume
#
# {glue:text}`cap-ch06-resume`
#
# {glue:md}`con-ch06-resume`
# ```
#
# {numref}`fig-ch06-resume` shows each incomplete resume leaving the full one at the first
# step and never rejoining it within 30 steps. A reproducible training record therefore
# includes the optimiser tensors and counters, the sampler's position and random state, and
# the precision of everything it stores, not just the weights.
#
# M15 is an experiment on one network. It holds at our scale if the full-state resume
# reproduces the uninterrupted run exactly (largest difference here
# {glue:text}`ch06-m15-exact`), while the AdamW run resumed from the weights alone is apart
# from it by more than $10^{-10}$ after one step and after 30 (here
# {glue:text}`ch06-resume-adam-1` and {glue:text}`ch06-resume-adam-30`, against
# {glue:text}`ch06-resume-adam-travel` travelled by the full run).

# %% tags=["remove-cell"]
weights_only_gaps = [adamw_gaps["weights only"][k] for k in (1, 30)]
m15_status = ("holds at our scale" if resume_exact == 0.0 and min(weights_only_gaps) > 1e-10
              else "differs")
glue_value("ch06-m15-exact", fmt(resume_exact))
ledger.add("M15", "Optimiser state is part of the trajectory: resuming from weights alone (Adam "
           "moments reset) changes the next steps",
           f"full resume: gap {fmt(resume_exact)}; AdamW from weights alone: "
           f"{fmt(adamw_gaps['weights only'][1], 2)} after 1 step, "
           f"{fmt(adamw_gaps['weights only'][30], 2)} after 30",
           details={"full resume minus uninterrupted run, largest |difference|": resume_exact,
            **{f"{name}, {case}: |d theta| after k = 1, 10, 30": [d[k].item() for k in (1, 10, 30)]
               for name, cases in distance.items() for case, d in cases.items()}}, sig=2,
           status=m15_status,
           note=("was 'holds'; under this chapter's rule an experiment on one network holds at "
                 "our scale: one 1,210-parameter tanh MLP on 512 digits, where AdamW resumed from "
                 f"weights alone is {fmt(weights_only_gaps[0], 2)} away after one step, "
                 f"{fmt(weights_only_gaps[1], 2)} after 30 (full run travels {fmt(travelled, 2)})")
           if m15_status == "holds at our scale"
           else "a resume from the full state departs from the uninterrupted run, or one from "
                "weights alone does not")

# %% [markdown]
# ## What this establishes
#
# The update rule is part of the question "which minimum?", and so is its state.
#
# ```{admonition} What you now know, and what does not follow
# :class: important
# **You now know**
# - that the lab's results, computed by two independent implementations, follow from one
#   number per direction, the factor $1 - \eta\lambda$: $-1$ on the ravine at $\eta = 0.1$,
#   $1 + \eta$ on the saddle;
# - that a gradient step depends on the coordinates, while a natural-gradient step fixes the
#   function's first-order change;
# - that mini-batch noise is concentrated along high-curvature directions, that the batch
#   size changes where SGD ends, and that momentum and Adam reshape the noise in time and in
#   direction;
# - that weight decay means different algorithms under SGD and Adam, and that a checkpoint
#   without optimiser, sampler or precision state is a different starting condition.
#
# **What does not follow**
# - that escaping saddles finds a good predictor: a network with every unit dead passes the
#   second-order stationarity test exactly;
# - which optimiser finds better predictors: the matched comparison says what a fair
#   comparison must hold fixed, on three seeds of one small network;
# - that the noise ratios or the batch-size trend are laws: they are measured on one
#   1,210-parameter network.
# ```
#
# ## Exercises
#
# ```{admonition} Exercise: a steeper ravine
# :class: tip
# Change the ravine's curvature ratio from $\kappa = 20$ to $\kappa = 25$, keep gradient
# descent at learning rate 0.1, and predict what happens to $y$. (Hint: the factor
# $1 - \eta\kappa$.)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# Now $\eta\kappa = 2.5 > 2$ and the factor is $-1.5$: $y_t = 4\,(-1.5)^t$ grows without bound,
# flipping sign each step, while $x$ still converges. After 20 steps $|y| = 4 \cdot 1.5^{20}$.
# The cell below checks it with `run_lab`.
# ```

# %% tags=["hide-cell"]
steeper = run_lab(LabConfig("gd", "ravine", 0.1, steps=20, kappa=25.0))
assert np.allclose(steeper.y, 4.0 * (-1.5) ** steeper.t, rtol=1e-12)
print(f"|y_20| = {fmt(abs(steeper.y[-1]))}, 4 x 1.5^20 = {fmt(4 * 1.5**20)}")

# %% [markdown]
# ```{admonition} Exercise: a smaller kick
# :class: tip
# Change the saddle's starting kick from $y_0 = 10^{-3}$ to $y_0 = 10^{-6}$ and predict how
# many more steps gradient descent (learning rate 0.1) needs before the loss drops below
# $-0.20$. (Hint: the escape time $\log(1/y_0)/\log(1 + \eta)$.)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# Each factor of 1,000 in $y_0$ costs $\log(1000)/\log(1.1) \approx 72.5$ more steps of
# geometric growth, and the rest of the escape is unchanged, so the drop below $-0.20$ comes
# about 72 steps later (and no longer happens within the source's 80 steps). The cell below
# checks it with `run_lab`.
# ```

# %% tags=["hide-cell"]
smaller_kick = run_lab(LabConfig("gd", "saddle", 0.1, steps=250, perturbation=1e-6))
delay = dynamics.first_step_below(smaller_kick.loss, -0.20) - first_below
assert abs(delay - np.log(1000) / np.log(1.1)) <= 1.5 and smaller_kick.loss[80] > -0.20
print(f"loss first below -0.20 {delay} steps later "
      f"(predicted {fmt(np.log(1000) / np.log(1.1), 3)})")

# %% [markdown]
# ```{admonition} Exercise: resuming plain SGD
# :class: tip
# Repeat the weights-only resume with plain SGD (learning rate 0.1, no momentum) and predict
# the distance between the weights-only and the full-state continuation. (Hint: what does
# plain SGD remember between steps?)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# Nothing: its update $\theta \leftarrow \theta - \eta \hat g$ uses only the current weights and
# batch, so both continuations are the same computation and the distance is exactly zero at
# every step. (The sampler state still matters.) The cell below checks it with
# `closure_parameter_path`.
# ```

# %% tags=["hide-cell"]
plain_sgd = training.sgd(0.1)
checkpoint = training.train(batch_loss, theta0, plain_sgd, 100, batches=resume_schedule)
with_state, without = (training.closure_parameter_path(batch_loss, checkpoint.params, plain_sgd,
                                                  resume_schedule[100:], state)
                       for state in (checkpoint.state, None))
assert torch.equal(with_state, without)
print(f"largest distance over 30 steps: {fmt((with_state - without).norm(dim=1).max().item())}")

# %% [markdown]
# ## Results ledger

# %%
ledger

# %% [markdown]
# The other claims of the same series are established elsewhere: M1 in
# {numref}`Chapter %s <ch-perturbation-sets>`, M2-M4 in {numref}`Chapter %s <ch-curvature-spectrum>`,
# M5 and M6 in {numref}`Chapter %s <ch-step-size>`, and M11-M13 in
# {numref}`Chapter %s <ch-landscape-pictures>`.
