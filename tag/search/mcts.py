"""Monte Carlo tree search with PUCT (TAG §4.2.2), split the way the paper describes it.

Each iteration:

1. **select** — from the root, follow the action of highest PUCT score

       U(s, a) = Q(s, a) + c · G(s, a) · √(Σ_a' N(s, a')) / (1 + N(s, a))          (TAG §4.2.2)

   until a vertex not yet expanded (created now, on the first visit of its edge) or a terminal one.
   Q is the mean backed-up value of the child, min-max normalised over the values seen so far so that
   c does not depend on the reward's scale; an unvisited child takes its parent's Q (less an optional
   first-play reduction, which makes the search deepen sooner). Invalid actions and
   exhausted subtrees are masked out before the argmax; ties go to the larger prior, then to a seeded
   random choice (at a fresh vertex Σ N = 0 and the priors alone decide);
2. **evaluate** — the environment completes the vertex's plan with its default fill and simulates it;
3. **expand** — the evaluator (the GNN, or uniform priors: "pure MCTS") gives priors G(s, ·) over the
   vertex's candidates, from a state that carries the simulator's feedback of that plan;
4. **backup** — N and the value sum of every vertex on the path grow by 1 and the leaf's value.

With ``batch_size > 1`` several leaves are selected before any is evaluated; each selected path takes a
*virtual loss* (one visit of the lowest value seen) so that the next selection goes elsewhere, and one
call of a :data:`~tag.search.base.BatchEvaluator` gives all their priors.

A vertex is *exhausted* when it is terminal or every valid child is exhausted; the search stops early
when the root is (a small tree fully explored).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from tag._rng import as_rng
from tag.search.base import BatchEvaluator, Evaluator, frozen_gc, uniform_evaluator
from tag.search.env import LeafEvaluation, SearchEnv
from tag.search.errors import SearchError
from tag.search.result import ProgressCallback, SearchResult, Tracker, TrainingTarget
from tag.search.tree import NO_PARENT, ROOT, UNVISITED, Tree

__all__ = ["mcts_search", "puct_scores", "select_action", "select", "evaluate", "expand", "backup",
           "visit_targets", "DEFAULT_C_PUCT", "DEFAULT_FPU_REDUCTION", "DEFAULT_TARGET_VISITS"]

# c of TAG §4.2.2, against Q normalised into [0, 1]. With uniform priors over ~500 candidates, 3 beat 1.25
# and 6 on small graphs (vgg19 / bert-small tiny, 8 groups, tag-testbed, 300 iterations, 3 seeds).
DEFAULT_C_PUCT = 3.0
DEFAULT_FPU_REDUCTION = 0.0  # the paper's plain rule: an unvisited child is worth its parent's Q
DEFAULT_TARGET_VISITS = 800  # TAG §4.2.2: π is collected "at vertices with at least 800 visit counts"


class _Pending(NamedTuple):
    """A leaf selected in the current batch, with the virtual loss its path holds."""

    node: int
    virtual_value: float


def puct_scores(q: np.ndarray, prior: np.ndarray, visits: np.ndarray, *, c: float) -> np.ndarray:
    """U(s, a) = Q(s, a) + c · G(s, a) · √(Σ N(s, ·)) / (1 + N(s, a)), TAG §4.2.2. All arrays [A]."""
    return q + c * prior * np.sqrt(visits.sum()) / (1.0 + visits)


def select_action(tree: Tree, node: int, *, c: float, rng: np.random.Generator, fpu_reduction: float = 0.0) -> int:
    """The action of expanded ``node`` with the highest PUCT score among the selectable ones (module
    docstring); -1 when none is selectable. An unvisited child's Q is its parent's, less ``fpu_reduction``
    (in normalised units)."""
    edges = tree.edges(node)
    child = tree.child[edges]  # [A]
    exists = child != UNVISITED
    ids = np.maximum(child, 0)
    visits = np.where(exists, tree.visits[ids], 0)  # [A] N(s, a)
    mean = np.divide(tree.value_sum[ids], visits, out=np.zeros(len(visits)), where=visits > 0)
    q = np.where(visits > 0, tree.normalise(mean), tree.normalise(tree.mean_value(node)) - fpu_reduction)  # [A]
    prior = tree.prior[edges]  # [A]
    selectable = tree.valid[edges] & ~(exists & tree.exhausted[ids])
    if not selectable.any():
        return -1
    scores = np.where(selectable, puct_scores(q, prior, visits, c=c), -np.inf)
    top = selectable & (scores == scores.max())
    top &= prior == prior[top].max()
    choices = np.flatnonzero(top)
    return int(choices[0] if len(choices) == 1 else rng.choice(choices))


def select(tree: Tree, env: SearchEnv, *, c: float, rng: np.random.Generator, fpu_reduction: float = 0.0) -> int:
    """Descend from the root to a leaf: a vertex not expanded yet (created here when its edge is taken
    for the first time) or a terminal one. Returns its node id."""
    node = ROOT
    while tree.expanded(node) and tree.num_edges[node] > 0:
        action = select_action(tree, node, c=c, rng=rng, fpu_reduction=fpu_reduction)
        if action < 0:  # nothing selectable below: only an exhausted vertex, which is never descended into
            return node
        child = int(tree.child[tree.edge(node, action)])
        if child == UNVISITED:
            return tree.add_node(node, action, env.step(tree.states[node], action))
        node = child
    return node


def evaluate(tree: Tree, env: SearchEnv, node: int) -> LeafEvaluation:
    """The simulator's score of the vertex's plan (undecided parts filled by the environment)."""
    return env.evaluate(tree.states[node])


def expand(tree: Tree, node: int, prior: np.ndarray, valid: np.ndarray) -> None:
    """Give ``node`` its candidate actions: ``prior`` [A] from the evaluator, ``valid`` [A] bool.

    Invalid actions get prior 0 and the rest is renormalised; when the evaluator puts no mass on a valid
    action, the valid ones share it equally. A vertex with no valid action is exhausted at once."""
    prior = np.asarray(prior, dtype=np.float64).reshape(-1)
    if prior.shape != valid.shape:
        raise SearchError(f"the evaluator gave {prior.size} priors for {valid.size} candidate actions")
    if not np.isfinite(prior).all() or (prior < 0).any():
        raise SearchError("the evaluator's priors must be finite and non-negative")
    masked = np.where(valid, prior, 0.0)
    total = masked.sum()
    if total > 0:
        masked /= total
    elif valid.any():
        masked = valid / valid.sum()
    tree.add_edges(node, masked, valid)
    if not valid.any():
        _mark_exhausted(tree, node)


def backup(tree: Tree, node: int, value: float) -> None:
    """Add one visit and ``value`` to every vertex from ``node`` up to the root (TAG §4.2.2)."""
    tree.min_value = min(tree.min_value, value)
    tree.max_value = max(tree.max_value, value)
    _add_along_path(tree, node, 1, value)


def _add_along_path(tree: Tree, node: int, visits: int, value: float) -> None:
    while node != NO_PARENT:
        tree.visits[node] += visits
        tree.value_sum[node] += value
        node = int(tree.parent[node])


def _mark_exhausted(tree: Tree, node: int) -> None:
    """``node`` has nothing left to evaluate below it; propagate to ancestors whose valid children all are."""
    tree.exhausted[node] = True
    node = int(tree.parent[node])
    while node != NO_PARENT:
        edges = tree.edges(node)
        child = tree.child[edges][tree.valid[edges]]
        if (child == UNVISITED).any() or not tree.exhausted[child].all():
            return
        tree.exhausted[node] = True
        node = int(tree.parent[node])


def visit_targets(tree: Tree, env: SearchEnv, *, min_visits: int) -> list[TrainingTarget]:
    """For each expanded vertex with at least ``min_visits`` visits, its state and π(s) = N(s, ·) / Σ N(s, ·)
    over its candidates (TAG §4.2.2's softmax of ln N)."""
    count = tree.num_nodes
    nodes = np.flatnonzero((tree.visits[:count] >= min_visits) & (tree.num_edges[:count] > 0))
    targets = []
    for node in nodes:
        visits = tree.child_visits(int(node)).astype(np.float64)  # [A]
        total = visits.sum()
        if total > 0:
            targets.append(TrainingTarget(env.observe(tree.states[node]), visits / total, int(tree.visits[node])))
    return targets


def mcts_search(env: SearchEnv, evaluator: Evaluator = uniform_evaluator, *,
                batch_evaluator: BatchEvaluator | None = None, batch_size: int = 1,
                c_puct: float = DEFAULT_C_PUCT, fpu_reduction: float = DEFAULT_FPU_REDUCTION,
                max_iterations: int | None = None,
                max_simulations: int | None = None, time_limit_s: float | None = None,
                target_visits: int | None = DEFAULT_TARGET_VISITS, seed: int | np.random.Generator | None = 0,
                progress: ProgressCallback | None = None, stop_value: float | None = None,
                patience: int | None = None) -> SearchResult:
    """Search ``env`` by MCTS until a budget is spent; return the best complete plan simulated.

    ``evaluator`` gives the priors of one vertex; ``batch_evaluator`` (when given) those of up to
    ``batch_size`` leaves at once, selected under virtual loss. ``c_puct``: c of TAG §4.2.2.
    ``fpu_reduction``: subtracted from the parent's normalised Q to value an unvisited child. Budgets
    (at least one): ``max_iterations`` (leaves evaluated), ``max_simulations`` (distinct plans
    simulated), ``time_limit_s``. ``target_visits``: collect training targets at vertices with at
    least this many visits (None: none). ``seed`` breaks ties. ``progress`` is called after every
    iteration with a :class:`~tag.search.result.SearchProgress`. Optional early stops (None: off):
    ``stop_value``, once the best value reaches it (a value that proves optimality, such as a bound over
    the time); ``patience``, after that many iterations in a row that did not improve the best plan.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if batch_size > 1 and batch_evaluator is None:
        raise ValueError("batch_size > 1 needs a batch_evaluator")
    if not c_puct >= 0:
        raise ValueError(f"c_puct must be non-negative, got {c_puct!r}")
    if stop_value is not None and not np.isfinite(stop_value):
        raise ValueError(f"stop_value must be a finite number or None, got {stop_value!r}")
    if patience is not None and (isinstance(patience, bool) or not isinstance(patience, (int, np.integer))
                                 or patience < 1):
        raise ValueError(f"patience must be a positive integer or None, got {patience!r}")
    rng = as_rng(seed)
    tracker = Tracker(env, max_iterations=max_iterations, max_simulations=max_simulations,
                      time_limit_s=time_limit_s, progress=progress)
    tree = Tree.empty(env.root())
    with frozen_gc():  # the environment's tables and caches, built by now, stay out of the collector's scans
        while not tracker.done() and not tree.exhausted[ROOT] and not _settled(tracker, stop_value, patience):
            room = batch_size if max_iterations is None else min(batch_size, max_iterations - tracker.iteration)
            pending = _select_batch(tree, env, room, c=c_puct, rng=rng, fpu_reduction=fpu_reduction)
            if not pending:
                break
            evaluations = [evaluate(tree, env, p.node) for p in pending]
            priors = _priors(tree, env, [p.node for p in pending], evaluator, batch_evaluator)
            for leaf, evaluation, prior in zip(pending, evaluations, priors):
                _add_along_path(tree, leaf.node, -1, -leaf.virtual_value)
                if not tree.expanded(leaf.node):
                    expand(tree, leaf.node, prior, env.valid_actions(tree.states[leaf.node]))
                backup(tree, leaf.node, evaluation.value)
                tracker.record(evaluation)
                tracker.step()
    targets = [] if target_visits is None else visit_targets(tree, env, min_visits=target_visits)
    return tracker.result("mcts", targets, tree)


def _settled(tracker: Tracker, stop_value: float | None, patience: int | None) -> bool:
    """An early stop of :func:`mcts_search` applies: the best value reaches ``stop_value``, or the last
    ``patience`` iterations did not improve the best plan (its history's last point)."""
    if stop_value is not None and tracker.best.value >= stop_value:
        return True
    return patience is not None and tracker.iteration - tracker.history[-1].iteration >= patience


def _select_batch(tree: Tree, env: SearchEnv, count: int, *, c: float, rng: np.random.Generator,
                  fpu_reduction: float) -> list[_Pending]:
    """Up to ``count`` distinct leaves, each path holding a virtual loss until its leaf is backed up.
    Stops early when a selection returns a leaf already chosen (or an exhausted vertex)."""
    pending: list[_Pending] = []
    chosen: set[int] = set()
    for _ in range(count):
        node = select(tree, env, c=c, rng=rng, fpu_reduction=fpu_reduction)
        if node in chosen or tree.exhausted[node]:
            break
        chosen.add(node)
        virtual_value = tree.min_value if np.isfinite(tree.min_value) else 0.0
        _add_along_path(tree, node, 1, virtual_value)
        pending.append(_Pending(node, virtual_value))
    return pending


def _priors(tree: Tree, env: SearchEnv, nodes: list[int], evaluator: Evaluator,
            batch_evaluator: BatchEvaluator | None) -> list[Any]:
    """Priors [A] of each node that needs expanding; an empty array for the others (terminal, or already
    expanded)."""
    needs = [n for n in nodes if not tree.expanded(n) and env.num_actions(tree.states[n]) > 0]
    out: dict[int, Any] = {}
    if needs:
        states = [env.observe(tree.states[n]) for n in needs]
        priors = batch_evaluator(states) if batch_evaluator is not None else [evaluator(s) for s in states]
        if len(priors) != len(states):
            raise SearchError(f"the batch evaluator returned {len(priors)} priors for {len(states)} states")
        out = dict(zip(needs, priors))
    return [out.get(n, np.zeros(0)) for n in nodes]
