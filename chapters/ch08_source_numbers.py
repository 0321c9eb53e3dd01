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
# (ch-softmax-gauge-source)=
# # Reproducing the source's numbers
#
# The source reports four numbers about the gauge of trained classifiers: the ratio
# $B_{\rm raw}/B_{\rm quot}$ at initialisation (1.103-1.118 over five ResNet-18 heads), the
# share of $\lVert W\rVert_F^2$ that centring removes in frozen-feature probes
# (1.93-2.36%), the range of the reference-class ratios (1.939-2.045), and the looseness
# $B_{\rm quot}/\kappa_{\rm exact}$ of the quotient bound (102.95-108.44). This page measures
# each of them the way the source describes, at the small scale of
# {ref}`ch-softmax-gauge`, and says which differences the computations here account for
# and which they do not.
#
# ```{admonition} Key ideas
# :class: tip
# - What you need from {ref}`ch-softmax-gauge`: the proxies $\kappa_{\rm exact} \le B_{\rm quot}
#   \le B_{\rm raw}$ ({eq}`eq-ch08-kappa`), the centred classifier $W_c$ and the ratio
#   $B_{\rm raw}/B_{\rm quot} = 1/(1 - \text{share})$, the reference-class identity
#   ({eq}`eq-ch08-reference`) and the law of the ratio at initialisation
#   ({eq}`eq-ch08-init-law`).
# - The reported starting ratio is what initialisation gives a head 512 features wide.
# - A stored share records the training recipe: frozen-feature probes trained with SGD store
#   less than the reported share, probes trained with Adam more.
# - The reference-class ratios spread as much as the squared lengths of the centred class
#   rows differ; the rows of our digits models differ more than the reported range allows.
# - $B_{\rm quot}$ is loose by $K - 1$ times a row-distance factor: heads with about a
#   hundred classes show a hundredfold gap.
# ```
#
# **Claims established here:** S3, S4, S14 (S1 and S2 in {ref}`ch-softmax-gauge`).
#
# Each status in the ledger at the end is read from the outputs by one rule, with each
# claim's criterion stated before its row: **holds** for an identity (derived exactly here or
# in {ref}`ch-softmax-gauge`; the numeric checks confirm, to rounding, only that the code
# implements it); **holds at our scale** when every measured part of the claim meets its
# criterion on the small classifiers here, and every level the source states is met here or
# accounted for by a computation here; **differs** when the effect the claim describes is
# measured but a measured part goes the other way, or a level the source states is missed
# and nothing here accounts for the gap; **not reproduced** when the measurements show none
# of the effect the source reports.
#
# We load sympy, torch in float64 (one thread) and the book's package, as in
# {ref}`ch-softmax-gauge`:

# %% tags=["remove-cell"]
# Only on Google Colab: install the book's package and what the chapter imports.
import subprocess, sys
if "google.colab" in sys.modules:
    book = "lossgeom[book] @ git+https://github.com/lossgeom/same-function-different-geometry@main"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", book], check=True)

# %% tags=["hide-cell"]
from lossgeom_book.setup import setup

ledger = setup("reproducing the source's numbers", single_thread=True)

# %% tags=["hide-input"]
import numpy as np
import sympy as sp
import torch
from torch import nn
import matplotlib.pyplot as plt
from IPython.display import Math, display

from lossgeom import flatness, training
from lossgeom.contract import MeasurementContract
from lossgeom.flatness import softmax_gauge as sm
from lossgeom.formatting import fmt, rounding_level
from lossgeom_book import data, tasks
from lossgeom_book import classifiers as toy_classifiers
from lossgeom_book import softmax_head
from lossgeom_book.display import glue_figure, glue_value

# %% [markdown]
# Printed numbers carry three or four significant digits for quantities that come out of
# training runs, and discrepancies at the level of float64 rounding are reported only as
# lying below a stated floor.
#
# ## The classifiers of the first page
#
# We retrain the sweep of {ref}`ch-softmax-gauge` on the same 600 digit images
# (`lossgeom_book.classifiers.GAUGE_SWEEP`: a linear model and an MLP 64-64-10, over
# initialisation scale, optimiser and weight decay, 150 full-batch steps each through
# `train_setting`), keeping only the trained parameters:

# %%
split = data.digits(n_train=600, n_test=400, seed=0)
x_train, y_train, x_test, y_test = split.x_train, split.y_train, split.x_test, split.y_test
train = lambda setting, seed=0: toy_classifiers.train_setting(setting, x_train, y_train,
                                                               seed=seed)[0]
runs = {setting: train(setting) for setting in toy_classifiers.GAUGE_SWEEP}

# %% [markdown]
# Two helpers: a run's final $B_{\rm raw}/B_{\rm quot}$, and a range printed with a given
# number of digits. The MLP's final ratios are those of the first page:

# %%
final_ratio = lambda setting: float(softmax_head.raw_quotient_ratio(runs[setting]["weight"]))
span = lambda values, sig=4: f"{fmt(min(values), sig)}-{fmt(max(values), sig)}"
mlp_setting = lambda optimizer, decay: ((64, 64, 10), optimizer, 1.0, decay)
for optimizer in ("sgd", "adam"):
    plain, decayed = (fmt(final_ratio(mlp_setting(optimizer, d)), 4) for d in (0.0, 1e-2))
    print(f"MLP, {optimizer}: B_raw/B_quot after 150 steps {plain} (wd 0), {decayed} (wd 1e-2)")

# %% [markdown]
# ## The starting ratio of a ResNet-18 head
#
# The reported starting band, 1.103-1.118, comes from five ResNet-18 heads ($d = 512$,
# $K = 10$). By {eq}`eq-ch08-init-law` the ratio at initialisation is $1 + F/(K-1)$ with
# $F \sim F(d, (K-1)d)$; we take the law's 5, 50 and 95% quantiles at the digits width
# $d = 64$ and at $d = 512$, 200 seeded draws of PyTorch's default initialisation at
# $d = 512$, and the starts of the first page's runs (seed 0 of the linear model and of the
# MLP; the initialisation scale does not change the ratio):

# %%
levels = [0.05, 0.5, 0.95]
init_law = {d: softmax_head.initial_ratio_quantiles(10, d, levels) for d in (64, 512)}
init_ratio = lambda sizes, seed: float(softmax_head.raw_quotient_ratio(
    toy_classifiers.init_classifier(sizes, seed=seed)["weight"]))
draws_512 = np.array([init_ratio([512, 10], seed) for seed in range(200)])
starts = [init_ratio(sizes, 0) for sizes in ([64, 10], [64, 64, 10])]

# %% [markdown]
# We count the draws inside the reported band, and a helper prints three quantiles:

# %%
in_band_512 = int(((draws_512 >= 1.103) & (draws_512 <= 1.118)).sum())
quantile_text = lambda values: " / ".join(fmt(value, 4) for value in values)

# %% [markdown]
# The law, the draws and our starts:

# %%
print(f"d = 512: 5/50/95% law {quantile_text(init_law[512])},"
      f" draws {quantile_text(np.quantile(draws_512, levels))}")
print(f"         {in_band_512} of 200 draws inside 1.103-1.118")
print(f"d =  64: 5/50/95% law {quantile_text(init_law[64])}; our starts {span(starts)}")
assert init_law[512][0] < 1.103 and init_law[512][2] > 1.118 and in_band_512 > 100
assert min(starts) > 1.118  # our d = 64 heads start above the reported band

# %% tags=["remove-cell"]
glue_value("ch08-law-512", span(init_law[512][[0, 2]]))
glue_value("ch08-our-starts", span(starts))

# %% [markdown]
# At $d = 512$ the central 90% of starts, {glue:text}`ch08-law-512`, contains the reported
# band, and most single draws fall inside it: the reported start is what a ResNet-18 head's
# initialisation gives. Our digits heads start at {glue:text}`ch08-our-starts`, above the
# reported band and unremarkable for heads eight times narrower than a ResNet-18's.
#
# ## Frozen-feature probes, like with like
#
# The reported share of 1.93-2.36% comes from ten linear probes on frozen CIFAR-10
# features. The comparable experiment here is ten probes (seeds 0-9) on frozen learned
# features: the hidden layer of the MLP retrained above with SGD (default initialisation, no
# weight decay), held fixed. The source does not state the probes' optimiser, so we train
# them with both:

# %%
frozen = toy_classifiers.classifier_features(runs[mlp_setting("sgd", 0.0)], x_train)  # held fixed


def probe_share(seed, optimizer):  # a linear probe (64 -> 10), 150 full-batch steps
    probe, _ = toy_classifiers.train_setting(((64, 10), optimizer, 1.0, 0.0), frozen, y_train,
                                             seed=seed)
    return 100 * float(sm.mean_row_share(probe["weight"]))


# %% [markdown]
# Ten probes per optimiser:

# %%
probe_shares = {optimizer: [probe_share(seed, optimizer) for seed in range(10)]
                for optimizer in ("sgd", "adam")}
for optimizer, shares in probe_shares.items():
    print(f"ten {optimizer} probes on frozen MLP features: stored share {span(shares, 3)}%")
assert max(probe_shares["sgd"]) < 1.93 and min(probe_shares["adam"]) > 2.36  # the reported range

# %% [markdown]
# Every SGD probe stores a share below the reported range and every Adam probe one above
# it. As {ref}`ch-softmax-gauge` found along training, a stored share is a record of how the
# classifier was trained, not a property of the predictor; on the same frozen features the
# optimiser alone moves it across the reported range.
#
# S4 has two halves and a starting level. The weight-decay half holds if, under SGD and Adam
# alike, the MLP's final ratio with weight decay $10^{-2}$ is closer to 1 than without (here
# {glue:text}`ch08-sgd-plain` against {glue:text}`ch08-sgd-decay` under SGD, and
# {glue:text}`ch08-adam-plain` against {glue:text}`ch08-adam-decay` under Adam). The reported
# start, 1.103-1.118, is accounted for if it lies inside the 5-95% band of the initialisation
# law at $d = 512$ ({glue:text}`ch08-law-512`). The share is a level: it is met if the ten
# probes of one optimiser all store a share inside the reported 1.93-2.36% (here
# {glue:text}`ch08-s4-sgd-shares`% with SGD and {glue:text}`ch08-s4-adam-shares`% with Adam).
# S4 holds at our scale if all three are met, differs if the weight-decay half holds and a
# level is missed, and is not reproduced if weight decay does not bring the ratio closer to 1.
# Its status here: {glue:text}`ch08-s4-status`.

# %% tags=["remove-cell"]
extremes = lambda values: [min(values), max(values)]
distance_from_one = lambda optimizer, decay: abs(final_ratio(mlp_setting(optimizer, decay)) - 1)
s4_decay = all(distance_from_one(o, 1e-2) < distance_from_one(o, 0.0) for o in ("sgd", "adam"))
s4_start = init_law[512][0] <= 1.103 and 1.118 <= init_law[512][2]
s4_share = any(all(1.93 <= share <= 2.36 for share in shares) for shares in probe_shares.values())
s4_status = ("holds at our scale" if s4_decay and s4_start and s4_share
             else "differs" if s4_decay else "not reproduced")
glue_value("ch08-sgd-plain", final_ratio(mlp_setting("sgd", 0.0)), 4)
glue_value("ch08-sgd-decay", final_ratio(mlp_setting("sgd", 1e-2)), 4)
glue_value("ch08-adam-plain", final_ratio(mlp_setting("adam", 0.0)), 4)
glue_value("ch08-adam-decay", final_ratio(mlp_setting("adam", 1e-2)), 4)
glue_value("ch08-s4-sgd-shares", span(probe_shares["sgd"], 3))
glue_value("ch08-s4-adam-shares", span(probe_shares["adam"], 3))
glue_value("ch08-s4-status", s4_status)
ledger.add("S4", "In trained classifiers as stored the mean-row share is small, and weight decay "
           "drives $B_{\\rm raw}/B_{\\rm quot}$ toward 1",
           f"stored share {span(probe_shares['sgd'], 3)}% (SGD probes), "
           f"{span(probe_shares['adam'], 3)}% (Adam probes)",
           details={"B_raw/B_quot at init, F law 5-95%, d = 512": list(init_law[512][[0, 2]]),
            "seeded d = 512 inits inside 1.103-1.118": f"{in_band_512} of 200",
            "at init, F law 5-95%, d = 64": list(init_law[64][[0, 2]]),
            "MLP after 150 SGD steps, wd 0 / 1e-2": [final_ratio(((64, 64, 10), "sgd", 1.0, d))
                                                     for d in (0.0, 1e-2)],
            "after 150 Adam steps, wd 0, MLP / linear": [final_ratio((sizes, "adam", 1.0, 0.0))
                                                         for sizes in ((64, 64, 10), (64, 10))],
            "MLP after 150 Adam steps, wd 0 / 1e-2": [final_ratio(((64, 64, 10), "adam", 1.0, d))
                                                      for d in (0.0, 1e-2)],
            "share, 10 SGD probes, frozen features (%)": extremes(probe_shares["sgd"]),
            "share, 10 Adam probes (%)": extremes(probe_shares["adam"])},
           reported="1.93-2.36% share (10 frozen-feature probes); ratio starts at 1.103-1.118 "
                    "(5 ResNet-18s)",
           status=s4_status, sig=4,
           note=f"share: SGD probes store {span(probe_shares['sgd'], 3)}%, Adam probes "
                f"{span(probe_shares['adam'], 3)}%, both outside the reported range; weight decay "
                f"holds: Adam's MLP ratio {fmt(final_ratio(mlp_setting('adam', 0.0)), 4)} → "
                f"{fmt(final_ratio(mlp_setting('adam', 1e-2)), 4)} with wd 1e-2, SGD's "
                f"{fmt(final_ratio(mlp_setting('sgd', 0.0)), 4)} → "
                f"{fmt(final_ratio(mlp_setting('sgd', 1e-2)), 4)} "
                "(training alone nearly suffices); start band matches the d = 512 law")

# %% [markdown]
# ## Reference-class ratios in the source's setting
#
# The reported range 1.939-2.045 comes from five end-to-end checkpoints of one recipe, each
# centred and then given all ten reference classes. The comparable experiment is five seeds
# of one end-to-end recipe here: the MLP 64-64-10 trained with SGD for 150 steps, with and
# without weight decay $10^{-2}$ (the source's recipe uses weight decay; we show both). By
# {eq}`eq-ch08-reference` the ten ratios of one checkpoint average exactly 2, and each is
# $1 + K\lVert w_{c,r}\rVert^2/\lVert W_c\rVert_F^2$:

# %%
checkpoints = {(seed, decay): train(mlp_setting("sgd", decay), seed)
               for decay in (0.0, 1e-2) for seed in range(5)}
features_of = lambda q: toy_classifiers.classifier_features(q, x_test)
ratios_of = lambda q: softmax_head.reference_class_ratios(q["weight"], features_of(q)).numpy()
reference = {key: ratios_of(params) for key, params in checkpoints.items()}
pooled = {decay: np.concatenate([ratios for (_, d), ratios in reference.items() if d == decay])
          for decay in (0.0, 1e-2)}

# %% [markdown]
# The identity's check and the two ranges:

# %%
largest_mean_gap = max(abs(ratios.mean() - 2) for ratios in reference.values())
for decay, ratios in pooled.items():
    print(f"weight decay {fmt(decay)}: {len(ratios)} ratios from 5 seeds, {span(ratios, 3)};"
          f" sd {fmt(ratios.std(), 2)}")
print("largest |within-checkpoint mean - 2| (identity):", rounding_level(largest_mean_gap))
assert all(ratios.min() < 1.939 and ratios.max() > 2.045 for ratios in pooled.values())

# %% [markdown]
# The within-checkpoint means are 2 to rounding, as the identity requires. The ratios
# themselves spread more widely than reported, with or without weight decay
# ({numref}`fig-ch08-reference`). Within one checkpoint their standard deviation is exactly
# the coefficient of variation (CV) of the squared lengths of the centred class rows: the
# rows of these small digits models differ in length more than the reported range allows,
# which needs rows of nearly equal length. Would longer training make the rows more equal?
# We continue the five weight-decay checkpoints for 450 more steps, four times the training
# length in all (the momentum restarts):

# %%
go_on = lambda q: toy_classifiers.train_classifier(q, x_train, y_train, steps=450, lr=0.1,
                                                   weight_decay=1e-2)[0]
longer = {seed: go_on(checkpoints[seed, 1e-2]) for seed in range(5)}

# %% [markdown]
# The CV of the squared row lengths before and after:

# %%
squared_rows = lambda q: (sm.centre(q["weight"]) ** 2).sum(1)
row_cv = lambda q: float(squared_rows(q).std(correction=0) / squared_rows(q).mean())
before = {seed: checkpoints[seed, 1e-2] for seed in range(5)}
row_cvs = {steps: [row_cv(q) for q in models.values()]
           for steps, models in ((150, before), (600, longer))}

# %% [markdown]
# The CV against the ratios' spread, and the ranges after 150 and 600 steps:

# %%
sd_is_cv = max(abs(reference[seed, 1e-2].std() - row_cvs[150][seed]) for seed in range(5))
longer_ratios = np.concatenate([ratios_of(q) for q in longer.values()])
print("within-checkpoint sd of the ratios vs CV of the squared rows:", rounding_level(sd_is_cv))
for steps, ratios in ((150, pooled[1e-2]), (600, longer_ratios)):
    print(
        f"{steps} steps, wd 1e-2: CV of squared row lengths {span(row_cvs[steps], 3)};"
        f" ratios {span(ratios, 3)}"
    )
assert np.mean(row_cvs[600]) > np.mean(row_cvs[150]) and np.ptp(longer_ratios) > 2 * (2.045 - 1.939)
reported_cv_bound = (2.045 - 1.939) / 2  # an sd inside an interval is at most half its width
assert min(row_cvs[150] + row_cvs[600]) > reported_cv_bound

# %% tags=["remove-cell"]
glue_value("ch08-reported-cv", reported_cv_bound, 2)

# %% [markdown]
# Four times longer training leaves the rows no more equal: the CV rises slightly, and the
# ratios still spread over more than twice the reported range. The reported range implies
# a CV of at most {glue:text}`ch08-reported-cv` in each of the source's checkpoints (the
# standard deviation of values inside an interval is at most half its width); every one of
# ours lies above that, after 150 steps and after 600. Longer training does not close the
# gap at our scale, and what makes the source's rows more nearly equal cannot be checked
# without its checkpoints.
#
# The figure (code hidden in the rendered page):

# %% tags=["hide-input"]
reference_contract = MeasurementContract(
    centre="5 seeds x 2 weight decays of the MLP 64-64-10 after 150 SGD steps, centred (W_c)",
    directions="reference-class shifts W_c - 1 w_c,r^T, r = 0..9",
    normalisation="B_raw(W^(r)) / B_quot(W_c)", radius="n/a",
    loss="n/a (proxies of softmax cross-entropy curvature)",
    reduction="mean over examples (numerator and denominator)",
    data=f"{len(x_test)} held-out digits images", model_mode="n/a (no layers with state)",
    resolution="10 reference classes per checkpoint", precision="float64",
)
fig, ax = plt.subplots()
for i, ((seed, decay), ratios) in enumerate(reference.items()):
    ax.plot(np.full(len(ratios), i), ratios, "o", ms=3, color="C0" if decay == 0 else "C1")
    ax.plot([i - 0.3, i + 0.3], [ratios.mean()] * 2, color="k", lw=1.2)
ax.axhspan(1.939, 2.045, color="grey", alpha=0.2, label="reported range (5 ResNet-18 checkpoints)")
ax.set_xlabel("checkpoint: seeds 0-4 (blue: no weight decay, orange: weight decay 1e-2)")
ax.set_ylabel("B_raw(W^(r)) / B_quot(W_c)")
ax.legend(fontsize=8)
glue_figure("ch08-reference", fig, reference_contract,
            "Raw/quotient ratio for every reference class of ten checkpoints; black bars are the "
            "within-checkpoint means, exactly 2 (an identity)")

# %% [markdown]
# ```{glue:figure} fig-ch08-reference
# :name: fig-ch08-reference
#
# {glue:text}`cap-ch08-reference`
#
# {glue:md}`con-ch08-reference`
# ```
#
# S3 has two parts. Its identity holds if every checkpoint's mean ratio is 2 and the
# ratios' standard deviation equals the CV of the squared rows, to rounding (below
# $10^{-12}$; the larger gap lies {glue:text}`ch08-s3-identity-gap`). Its range is a level the
# source states: it is met if the 50 ratios of the weight-decay recipe lie inside
# 1.939-2.045 (here {glue:text}`ch08-s3-range`), and accounted for if four times longer
# training brings every checkpoint's CV to the reported bound {glue:text}`ch08-reported-cv` or
# below (here {glue:text}`ch08-s3-cv-600`). S3 holds at our scale if the identity holds and
# the range is met or accounted for, and differs if the identity holds and the range is
# neither. Its status here: {glue:text}`ch08-s3-status`.

# %% tags=["remove-cell"]
ROUNDING = 1e-12
gap_text = lambda gap, floor=ROUNDING: rounding_level(gap, floor) if gap < floor else fmt(gap, 2)
s3_identity_gap = max(largest_mean_gap, sd_is_cv)
s3_range_met = 1.939 <= pooled[1e-2].min() and pooled[1e-2].max() <= 2.045
s3_accounted = max(row_cvs[600]) <= reported_cv_bound
s3_status = ("holds at our scale" if s3_identity_gap < ROUNDING and (s3_range_met or s3_accounted)
             else "differs")
glue_value("ch08-s3-identity-gap", gap_text(s3_identity_gap))
glue_value("ch08-s3-range", span(pooled[1e-2], 3))
glue_value("ch08-s3-cv-600", span(row_cvs[600], 3))
glue_value("ch08-s3-status", s3_status)
ledger.add("S3", "Identity: $B_{\\rm raw}(W^{(r)})/B_{\\rm quot}(W_c) = 1 + K\\lVert w_{c,r}\\rVert^2"
           "/\\lVert W_c\\rVert_F^2$, its mean over $r$ exactly 2; and the range of the ratios "
           "on trained models",
           f"ratios {span(pooled[1e-2], 3)} (weight decay), {span(pooled[0.0], 3)} (none); "
           "mean over $r$: 2 (identity)",
           details={"mean over r = 2": "identity (sympy, general K)",
            "largest |mean - 2|, 10 checkpoints": rounding_level(largest_mean_gap),
            "range, 5 seeds, SGD": extremes(pooled[0.0]),
            "range, 5 seeds, SGD + wd 1e-2": extremes(pooled[1e-2]),
            "sd of the ratios vs CV of squared rows (identity)": rounding_level(sd_is_cv),
            "CV of squared rows, wd 1e-2, 150 / 600 steps": [extremes(row_cvs[150]),
                                                              extremes(row_cvs[600])],
            "range, 5 seeds, SGD + wd 1e-2, 600 steps": extremes(longer_ratios)},
           reported="ratios 1.939-2.045 (50 ratios, 5 end-to-end ResNet-18 checkpoints)",
           status=s3_status, sig=3,
           note="the identity holds exactly; the range, measured as the source does (5 seeds of "
                "one recipe), is wider: our class rows differ more in length (the ratios' sd is "
                "the CV of squared row lengths), and four times longer training does not "
                "equalise them")

# %% [markdown]
# ## How loose is the quotient bound?
#
# Quotienting repairs the gauge, not the looseness of the trace inequality. Write
# $D_{ij} = \lVert w_i - w_j\rVert^2$ for the squared distance between two class rows.
# Two identities, each a sum over feature columns, rewrite both sides of the bound in these
# distances: $\sum_{ij} p_i p_j D_{ij} = 2\operatorname{Var}_p(w_C)$ (which is
# $\kappa_{\rm exact}/\lVert h\rVert^2$), and $\sum_{ij} D_{ij} = 2K\lVert W_c\rVert_F^2$.
# Sympy checks both on one column of a 3-class classifier at a general point of the
# simplex. The symbols first:

# %%
K_small = 3  # the number of classes in the symbolic example
p0, p1 = sp.symbols("p0 p1", positive=True)
p_simplex = sp.Matrix([p0, p1, 1 - p0 - p1])  # a general point of the simplex
column = sp.Matrix(sp.symbols("c0:3", real=True))  # one feature column of W

# %% [markdown]
# Then the distances, the variance under $p$ and the centred column:

# %%
distance = lambda i, j: (column[i] - column[j]) ** 2
pairs = [(i, j) for i in range(K_small) for j in range(K_small)]
second_moment = sum(p_simplex[i] * column[i] ** 2 for i in range(K_small))
variance_p = second_moment - (p_simplex.T * column)[0] ** 2
centred_column = column - sp.ones(K_small, 1) * sum(column) / K_small

# %% [markdown]
# and check the two identities:

# %%
weighted_distances = sum(p_simplex[i] * p_simplex[j] * distance(i, j) for i, j in pairs)
assert sp.expand(2 * variance_p - weighted_distances) == 0
centred_norm_sq = (centred_column.T * centred_column)[0]
assert sp.expand(2 * K_small * centred_norm_sq - sum(distance(i, j) for i, j in pairs)) == 0

# %% [markdown]
# Since $1 - \lVert p\rVert^2 = \sum_{i \ne j} p_i p_j$, dividing the two gives, for one
# example,
#
# $$
# \begin{aligned}
# \frac{B_{\rm quot}}{\kappa_{\rm exact}}
# &= \frac{\lVert W_c\rVert_F^2\,(1 - \lVert p\rVert^2)}{\operatorname{Var}_p(w_C)}
# = (K - 1)\,\frac{\overline{D}}{\overline{D}_p},\\
# \overline{D} &= \frac{\sum_{i\ne j} D_{ij}}{K(K-1)},\qquad
# \overline{D}_p = \frac{\sum_{i\ne j} p_i p_j D_{ij}}{\sum_{i\ne j} p_i p_j} .
# \end{aligned}
# $$ (eq-ch08-looseness)
#
# At uniform $p$ the two averages coincide and the ratio is exactly $K - 1$. Sympy derives
# this for a symbolic number of classes, on one feature column $a_1, \dots, a_K$ (both
# proxies are sums over columns of the same per-column terms, so one column suffices):
# the centred squared norm, the variance of $a_C$ under $C$ uniform, and
# $1 - \lVert p\rVert^2$ at $p_k = 1/K$. The symbols, and a helper that moves constant
# factors out of sympy's sums:

# %%
K = sp.Symbol("K", integer=True, positive=True)  # the number of classes, symbolic
k, inner = sp.symbols("k j", integer=True)
a = sp.IndexedBase("a")  # one feature column: a_1, ..., a_K
factor_constants_out_of_sums = lambda e: e.replace(lambda x: isinstance(x, sp.Sum), sp.factor_terms)

# %% [markdown]
# The three quantities:

# %%
uniform = 1 / K
column_sum = sp.Sum(a[k], (k, 1, K))
centred_square = factor_constants_out_of_sums(
    sp.Sum((a[k] - sp.Sum(a[inner], (inner, 1, K)) / K) ** 2, (k, 1, K)).expand().doit()
).subs(sp.Sum(a[inner], (inner, 1, K)), column_sum)
variance_uniform = factor_constants_out_of_sums(
    (sp.Sum(uniform * a[k] ** 2, (k, 1, K)) - sp.Sum(uniform * a[k], (k, 1, K)) ** 2).doit())
hesitation_uniform = 1 - sp.Sum(uniform**2, (k, 1, K)).doit()

# %% [markdown]
# Their ratio simplifies to $K - 1$ exactly:

# %%
looseness_uniform = sp.simplify(centred_square * hesitation_uniform / variance_uniform)
assert looseness_uniform == K - 1
display(Math(r"\frac{B_{\rm quot}}{\kappa_{\rm exact}}\Big|_{p = \mathbf{1}/K} = "
             + sp.latex(looseness_uniform)))

# %% [markdown]
# Numerically, features orthogonal to every centred row give equal logits, hence exactly
# uniform $p$; on a random head with 97 classes the package's ratio is 96 to rounding:

# %%
W_random97 = torch.randn(97, 128, generator=torch.Generator().manual_seed(2))
null_rows = torch.linalg.svd(sm.centre(W_random97)).Vh[96:]  # W_c h = 0 for h in their span
h_uniform = torch.randn(5, 32, generator=torch.Generator().manual_seed(3)) @ null_rows
uniform_gap = float(softmax_head.quotient_looseness(W_random97, h_uniform) / 96 - 1)
print("K = 97, uniform p: B_quot / kappa_exact / 96 - 1:", rounding_level(uniform_gap, 1e-12))

# %% [markdown]
# Away from uniform the ratio is $K - 1$ times the factor $\overline{D}/\overline{D}_p$
# (`softmax_head.pair_distance_ratio`), which exceeds 1 when an example hesitates between classes
# whose rows are closer than an average pair. We check {eq}`eq-ch08-looseness` on the 400
# test images of the first page's linear model (plain SGD), first the left-hand side from
# the two proxies:

# %%
W_linear = runs[((64, 10), "sgd", 1.0, 0.0)]["weight"]  # the first page's linear model
kappa_per_image, quot_per_image = (proxy(W_linear, x_test, reduction="none")
                                   for proxy in (flatness.kappa_exact, flatness.b_quot))
looseness_per_image = quot_per_image / kappa_per_image

# %% [markdown]
# then the right-hand side from the pairwise distances alone, compared image by image:

# %%
pair_form = (W_linear.shape[0] - 1) * softmax_head.pair_distance_ratio(W_linear, x_test)
pair_form_gap = (pair_form / looseness_per_image - 1).abs().max()
print("B_quot / kappa_exact vs 9 x pair-distance ratio:", rounding_level(pair_form_gap))
print(f"median over the test images: {fmt(float(looseness_per_image.median()), 4)} (K - 1 = 9)")

# %% [markdown]
# The looseness is therefore set by the number of classes first. We measure it as the
# ratio of training-set means on every digits checkpoint of the sweep, and on MLPs trained
# the same way on 3- and 5-class subsets of the digits:

# %%
looseness_of = lambda q, x: softmax_head.quotient_looseness(
    q["weight"], toy_classifiers.classifier_features(q, x)
)
train_looseness = lambda q, x: float(looseness_of(q, x))
digits_looseness = [train_looseness(params, x_train) for params in runs.values()]
subsets = {
    len(classes): data.digits(n_train=300, n_test=50, seed=0, classes=classes)
    for classes in ((0, 1, 2), (0, 1, 2, 3, 4))
}

# %% [markdown]
# The subset models train as the 10-class MLP did:

# %%
train_subset = lambda n: toy_classifiers.train_setting(
    ((64, 64, n), "sgd", 1.0, 0.0), subsets[n].x_train, subsets[n].y_train
)[0]
subset_models = {n: train_subset(n) for n in subsets}
subset_looseness = {n: train_looseness(subset_models[n], subsets[n].x_train) for n in subsets}
print(f"K = 10, {len(digits_looseness)} checkpoints: {span(digits_looseness, 3)}  (K - 1 = 9)")
for n, value in subset_looseness.items():
    print(f"K = {n:>2}, one MLP: {fmt(value, 3)}  (K - 1 = {n - 1})")

# %% [markdown]
# The row-distance factor, the looseness divided by $K - 1$, over these models:

# %%
digits_factors = [value / 9 for value in digits_looseness] + [
    value / (n - 1) for n, value in subset_looseness.items()]
assert min(digits_factors) > 0.95 and max(digits_factors) < 1.5

# %% tags=["remove-cell"]
glue_value("ch08-digits-factor", span(digits_factors, 3))

# %% [markdown]
# The looseness tracks $K - 1$: on these models the row-distance factor lies in
# {glue:text}`ch08-digits-factor`. The reported looseness, 102.95-108.44, was measured on
# modular-arithmetic transformer checkpoints whose modulus the source does not state. To
# test whether $K - 1$ explains it, we build heads with about a hundred classes: the two
# families of `lossgeom_book.tasks` at modulus 97 ($K = 97$, $K - 1 = 96$), an MLP (one hidden
# layer of 128) on $a - b$ and a one-layer transformer on $a + b$. Each trains with
# full-batch AdamW (learning rate $10^{-2}$, weight decay 1, the grokking recipe;
# `lossgeom.training`) on 20% of the pairs, two seeds each, and records
# $B_{\rm quot}/\kappa_{\rm exact}$ and the training accuracy on the training pairs every
# 25 steps. The source does not state its training length; `MODULAR_STEPS` sets ours, per
# family, long enough for each to fit its training pairs (the transformer fits about three
# times more slowly):

# %%
MODULAR_STEPS = {"MLP, a - b": 100, "transformer, a + b": 300}  # raise for longer runs


def looseness_run(model, pairs, steps, every=25):
    loss = training.indexed_loss(model, nn.CrossEntropyLoss(), (pairs.x_train, pairs.y_train))

    def monitor(q):  # (B_quot / kappa_exact, training accuracy) from the same features
        h, W = tasks.features(model, q, pairs.x_train), q[tasks.CLASSIFIER]
        fitted = float(((h @ W.T).argmax(-1) == pairs.y_train).double().mean())
        return float(softmax_head.quotient_looseness(W, h)), fitted

    adamw = training.adam(1e-2, weight_decay=1.0)  # decoupled weight decay: AdamW
    return training.train(loss, dict(model.named_parameters()), adamw, steps,
                            monitor=monitor, monitor_every=every)


# %% [markdown]
# The tasks and the two model families:

# %%
mod97 = {operation: tasks.modular_arithmetic(97, operation, train_fraction=0.2, seed=0)
         for operation in ("add", "subtract")}
mlp_97 = lambda seed: tasks.MLPClassifier(None, (128,), 97, modulus=97, seed=seed)
transformer_97 = lambda seed: tasks.ModularTransformer(97, d_model=32, n_heads=4, d_mlp=64,
                                                       seed=seed)
families = {"MLP, a - b": (mlp_97, "subtract"), "transformer, a + b": (transformer_97, "add")}

# %% [markdown]
# The four runs train in turn; each keeps its history and its accuracy on the held-out
# pairs at the end:

# %%
modular = {}
for name, (make_model, operation) in families.items():
    for seed in (0, 1):
        model, pairs = make_model(seed), mod97[operation]
        fit = looseness_run(model, pairs, MODULAR_STEPS[name])
        held_out = tasks.accuracy(model, (pairs.x_test, pairs.y_test), params=fit.params)
        modular[name, seed] = (fit.monitored, held_out)

# %% [markdown]
# Each run's looseness at initialisation, at its peak and at the end, each with the
# training accuracy of that checkpoint:

# %%
for (name, seed), (history, held_out) in modular.items():
    peak_step, (peak, peak_fit) = max(history[1:], key=lambda record: record[1][0])
    last_step, (last, last_fit) = history[-1]
    print(
        f"{name:<18} seed {seed}: init {fmt(history[0][1][0], 3)}; peak {fmt(peak, 3)} at step "
        f"{peak_step} (train acc {fmt(peak_fit, 2)}); step {last_step}: {fmt(last, 3)} (train acc "
        f"{fmt(last_fit, 2)}, held-out acc {fmt(held_out, 2)})"
    )

# %% [markdown]
# We split each history at a training accuracy of 0.95 ("fitted" below; a threshold we
# choose, printed with every value) and check the statements made below about the
# ranges:

# %%
FITTED = 0.95
looseness_where = lambda prefix, keep: [value for (name, _), (history, _) in modular.items()
                                        if name.startswith(prefix)
                                        for _, (value, fit) in history[1:] if keep(fit)]
fitted_values = {prefix: looseness_where(prefix, lambda fit: fit >= FITTED)
                 for prefix in ("MLP", "transformer")}
transformer_before_fit = looseness_where("transformer", lambda fit: fit < FITTED)
init_looseness = [history[0][1][0] for history, _ in modular.values()]
final_fit = {key: history[-1][1][1] for key, (history, _) in modular.items()}

# %% [markdown]
# The training accuracy of every checkpoint inside the reported band:

# %%
in_band = [fit for (name, _), (history, _) in modular.items()
           for _, (value, fit) in history if 102.95 <= value <= 108.44]

# %% [markdown]
# and the checks:

# %%
assert in_band and max(in_band) < FITTED  # only unfitted checkpoints fall inside the band
assert max(abs(value / 96 - 1) for value in init_looseness) < 0.01
assert min(final_fit.values()) >= FITTED
assert max(fitted_values["MLP"]) < 102.95 and min(fitted_values["transformer"]) > 108.44
for (name, _), (history, _) in modular.items():  # transformers peak before they fit, then fall
    peak_step, (peak, peak_fit) = max(history[1:], key=lambda record: record[1][0])
    assert name.startswith("MLP") or (peak_fit < FITTED and history[-1][1][0] < peak - 1)

# %% tags=["remove-cell"]
glue_value("ch08-init-looseness", span(init_looseness, 3))
glue_value("ch08-mlp-fitted", span(fitted_values["MLP"], 3))
glue_value("ch08-transformer-early", span(transformer_before_fit, 3))
glue_value("ch08-transformer-fitted", span(fitted_values["transformer"], 3))
glue_value(
    "ch08-transformer-final-fit",
    span([final_fit[key] for key in modular if key[0].startswith("transformer")], 2),
)
glue_value("ch08-held-out", span([held_out for _, held_out in modular.values()], 2))
glue_value("ch08-in-band-fit", max(in_band), 2)

# %% [markdown]
# At initialisation every head sits at {glue:text}`ch08-init-looseness`, within 1% of
# $K - 1 = 96$: the logits are small and $p$ is nearly uniform. The fitted MLP heads stay
# at {glue:text}`ch08-mlp-fitted`, a row-distance factor of about 1, below the reported
# band. The transformer's looseness climbs well above $K - 1$ before it fits: its
# checkpoints with training accuracy below 0.95 span {glue:text}`ch08-transformer-early`,
# and the only checkpoints inside the reported band are early ones on the way up
# (training accuracy at most {glue:text}`ch08-in-band-fit`). It peaks before it fits and
# falls back as it does, to {glue:text}`ch08-transformer-fitted` at the fitted checkpoints
# (training accuracy {glue:text}`ch08-transformer-final-fit` at the end), above the
# reported band: by {eq}`eq-ch08-looseness` its examples hesitate, on average,
# between classes whose rows are closer than an average pair
# ({numref}`fig-ch08-looseness`). None of these heads generalises in this budget
# (held-out accuracy {glue:text}`ch08-held-out`), whereas the source's checkpoints are
# trained models of a grokking study. At $K = 97$ the reported 102.95-108.44 therefore
# lies between the two families, in neither: a hundredfold looseness is what $K - 1$
# predicts for heads with about a hundred classes, and where in the band a head lands
# depends on its architecture and training through the row-distance factor.
#
# The figure (code hidden in the rendered page):

# %% tags=["hide-input"]
modular_pairs = len(mod97["add"].x_train)
looseness_contract = MeasurementContract(
    centre="checkpoints of modular-arithmetic heads, K = 97, every 25 AdamW steps (lr 1e-2, "
           f"weight decay 1): {', '.join(f'{n}: {s} steps' for n, s in MODULAR_STEPS.items())}",
    directions="n/a (a ratio of two curvature proxies)",
    normalisation="B_quot / kappa_exact, both means",
    radius="n/a", loss="softmax cross-entropy (the proxies bound its last-layer contraction)",
    reduction="ratio of the means over the training pairs",
    data=f"(a + b) and (a - b) mod 97, {modular_pairs} training pairs (20%), split seed 0",
    model_mode="n/a (no layers with state)",
    resolution="; ".join(f"{name}: {len(history)} checkpoints" for (name, seed), (history, _)
                         in modular.items() if seed == 0) + "; 2 seeds per family",
    precision="float64",
)
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9.0, 3.6), sharey=True)
for (name, seed), (history, _) in modular.items():
    steps = [step for step, _ in history]
    values, fits = np.array([record for _, record in history]).T
    style = dict(ls="-" if name.startswith("MLP") else "--", marker="o" if name.startswith("MLP")
                 else "s", ms=3, color=f"C{seed + 2 * name.startswith('transformer')}",
                 label=f"{name}, seed {seed}")
    ax0.plot(steps, values, **style)
    ax1.plot(fits, values, **style)
for ax in (ax0, ax1):
    ax.axhline(96, color="k", lw=0.8, label="K - 1 = 96 (exact at uniform p)")
    ax.axhspan(102.95, 108.44, color="grey", alpha=0.2, label="reported (modulus not stated)")
ax1.axvline(FITTED, color="grey", ls=":", lw=0.8)
ax0.set_xlabel("AdamW step")
ax1.set_xlabel("training accuracy at the checkpoint")
ax0.set_ylabel("B_quot / kappa_exact")
ax0.legend(fontsize=7)
glue_figure("ch08-looseness", fig, looseness_contract,
            "Looseness of the quotient bound for heads with 97 classes, against the training "
            "step (left) and the training accuracy (right): K - 1 at initialisation; fitted "
            "MLP heads stay near K - 1, transformer heads peak before they fit and settle "
            "above the reported band (dotted line: the 0.95 accuracy threshold)")

# %% [markdown]
# ```{glue:figure} fig-ch08-looseness
# :name: fig-ch08-looseness
#
# {glue:text}`cap-ch08-looseness`
#
# {glue:md}`con-ch08-looseness`
# ```
#
# In the ledger, S14's reported band is compared at $K = 97$, the modulus we assume. S14
# holds at our scale if the fitted checkpoints of one family lie inside the reported
# 102.95-108.44; it differs if they are of the reported order but outside the band (every
# fitted value between half its lower end and twice its upper end), and is not reproduced if
# a fitted head is tighter or looser than that. The fitted checkpoints span
# {glue:text}`ch08-mlp-fitted` (MLP) and {glue:text}`ch08-transformer-fitted` (transformer);
# S14's status here: {glue:text}`ch08-s14-status`.

# %% tags=["remove-cell"]
all_fitted = fitted_values["MLP"] + fitted_values["transformer"]
s14_in_band = any(102.95 <= min(v) and max(v) <= 108.44 for v in fitted_values.values())
s14_same_order = 102.95 / 2 <= min(all_fitted) and max(all_fitted) <= 2 * 108.44
s14_status = ("holds at our scale" if s14_in_band
              else "differs" if s14_same_order else "not reproduced")
glue_value("ch08-s14-status", s14_status)
ledger.add("S14", "$B_{\\rm quot}$ is far from tight: its ratio to $\\kappa_{\\rm exact}$ on trained "
           "checkpoints",
           f"$K = 97$, fitted heads: MLP {span(fitted_values['MLP'], 3)}, transformer "
           f"{span(fitted_values['transformer'], 3)}; $K - 1 = 96$",
           details={"at uniform p, general K": "exactly K - 1 (sympy; an identity)",
            "K = 97, uniform p: ratio / 96 - 1": rounding_level(uniform_gap, 1e-12),
            "K = 97 heads at init (2 families x 2 seeds)": extremes(init_looseness),
            "K = 97 MLP (a - b), train acc >= 0.95": extremes(fitted_values["MLP"]),
            "K = 97 transformer (a + b), train acc < 0.95": extremes(transformer_before_fit),
            "K = 97 transformer, train acc >= 0.95": extremes(fitted_values["transformer"]),
            "train acc at the end, MLP / transformer":
                [extremes([final_fit[key] for key in modular if key[0].startswith(prefix)])
                 for prefix in ("MLP", "transformer")],
            "held-out acc at the end, all four runs": extremes([h for _, h in modular.values()]),
            "K = 10 digits checkpoints": extremes(digits_looseness),
            "K = 3, K = 5 digits MLPs": [subset_looseness[3], subset_looseness[5]]},
           reported="about 100x (102.95-108.44 on modular checkpoints; modulus not stated)",
           status=s14_status, sig=3,
           note="assuming $K = 97$ (modulus not stated): $K - 1 = 96$ sets the scale, but no "
                "fitted head lands in the reported band (MLP below, transformer above); our heads "
                "memorise without generalising; the source's model, training fraction, weight "
                "decay and length are not stated")

# %% [markdown]
# ## Exercise
#
# ```{admonition} Exercise: a smaller modulus
# :class: tip
# Change the modulus of the MLP head on $a - b$ from 97 to 23 and predict
# $B_{\rm quot}/\kappa_{\rm exact}$ at initialisation. (Hint: {eq}`eq-ch08-looseness` at
# nearly uniform $p$.)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# About $K - 1 = 22$: at initialisation the logits are small, $p$ is close to uniform, and
# the row-distance factor is close to 1. The cell below measures it on the training pairs
# of $(a - b) \bmod 23$.
# ```

# %% tags=["hide-cell"]
mod23 = tasks.modular_arithmetic(23, "subtract", train_fraction=0.5, seed=0)
small_head = tasks.MLPClassifier(None, (128,), 23, modulus=23, seed=0)
params23 = {name: value.detach() for name, value in small_head.named_parameters()}
features23 = tasks.features(small_head, params23, mod23.x_train)
looseness23 = float(softmax_head.quotient_looseness(params23[tasks.CLASSIFIER], features23))
assert abs(looseness23 / 22 - 1) < 0.05
print(f"modulus 23 at initialisation: B_quot / kappa_exact = {fmt(looseness23, 3)} (K - 1 = 22)")

# %% [markdown]
# ## What this page establishes
#
# Set against the source's numbers, the quantities of {ref}`ch-softmax-gauge` behave as
# derived there. The reported starting ratio is accounted for by the width of the head; the
# stored share, the range of the reference-class ratios and the looseness band are missed
# here, each with the quantity that decides it measured (the probes' optimiser, the spread
# of the row lengths, the row-distance factor), but not what in the source's unstated
# settings sets it. {numref}`Chapter %s <ch-certificates>` turns from the gauge to a
# separate question: whether such a bound can certify robustness at all.
#
# ```{admonition} What you now know, and what does not follow
# :class: important
# **You now know**
# - that the reported starting ratio is what initialisation gives a head 512 features wide,
#   and that narrower heads scatter more widely around the same centre;
# - that the share a probe stores depends on how it was trained: SGD probes store less than
#   the reported share and Adam probes more;
# - that the spread of the reference-class ratios is the spread of the squared lengths of
#   the centred class rows, which on our digits models is wider than reported and is not
#   narrowed by four times longer training;
# - that $B_{\rm quot}$ is loose by $K - 1$ times a row-distance factor, so that heads with
#   about a hundred classes show a hundredfold gap.
#
# **What does not follow**
# - that $B_{\rm quot}$ is a good measure of flatness: it is still a loose trace bound;
# - that a stored share or a looseness value describes the predictor: the reported share is
#   one recipe's record (SGD and Adam probes store less and more), and where a head lands near
#   the reported looseness band depends on its architecture and training;
# - that the source's numbers are wrong: its models, and several of its settings (the
#   probes' optimiser, the modulus, the training length), are not available here.
# ```
#
# ## Results ledger
#
# The table is rendered from the values computed above (the same rows are stored as JSON
# for the claims appendix):

# %%
ledger

# %% [markdown]
# S1 and S2 are established in {ref}`ch-softmax-gauge`; the other claims of the same series
# next: S5-S9 in {numref}`Chapter %s <ch-certificates>` and S10-S13 in
# {numref}`Chapter %s <ch-regulariser-updates>`.
