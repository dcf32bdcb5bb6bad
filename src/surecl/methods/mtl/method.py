"""Multi-task learning: one stage on the union of all tasks, the usual upper bound of CL."""

from surecl.methods.base import Method, Stage


class MultiTask(Method):
    name = "mtl"
    continual = False

    def stages(self, n_tasks: int) -> list[Stage]:
        everything = tuple(range(n_tasks))
        return [Stage(everything, n_tasks - 1, everything)]
