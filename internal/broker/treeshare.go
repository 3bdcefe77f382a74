package broker

// How a tree's bound (connections, model body bytes) is shared. The
// orchestrator may hold half of it, its children together the other
// half, and one child half of theirs: one hostile child leaves room for
// its siblings, and no number of hostile children can leave their
// orchestrator (which decides, through its model, to destroy them) no
// room. Each share is at least 1.

// childrenShare is what tree bound treeMax leaves an orchestrator's
// children together.
func childrenShare[T int | int64](treeMax T) T { return max(1, treeMax-treeMax/2) }

// sandboxShare is what one sandbox of a tree bounded by treeMax may hold:
// an orchestrator half, a child half of the children's.
func sandboxShare[T int | int64](treeMax T, child bool) T {
	if child {
		return max(1, childrenShare(treeMax)/2)
	}
	return max(1, treeMax/2)
}

// shareName says which part of the tree's bound sandboxShare is.
func shareName(child bool) string {
	if child {
		return "a child, a quarter"
	}
	return "an orchestrator, half"
}

// treeTally is what the sandboxes of each tree hold of such a bound, by
// tree, by a tree's children together and by sandbox (its uuid); a figure
// back at 0 is forgotten.
type treeTally[T int | int64] struct {
	byTree     map[string]T
	childrenOf map[string]T // of byTree, the children's
	bySandbox  map[string]T
}

func newTreeTally[T int | int64]() treeTally[T] {
	return treeTally[T]{byTree: map[string]T{}, childrenOf: map[string]T{}, bySandbox: map[string]T{}}
}

// add counts n more (negative: n fewer) for sandbox of tree (child: not
// its orchestrator).
func (t treeTally[T]) add(tree, sandbox string, child bool, n T) {
	bump(t.byTree, tree, n)
	bump(t.bySandbox, sandbox, n)
	if child {
		bump(t.childrenOf, tree, n)
	}
}

func bump[T int | int64](m map[string]T, key string, n T) {
	if m[key] += n; m[key] == 0 {
		delete(m, key)
	}
}
