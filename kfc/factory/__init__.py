"""The factory: the evaluation gate, the search loop, its policies, and parallel evaluation."""
