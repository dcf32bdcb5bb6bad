"""The plugin protocol (:mod:`surecl.plugins.base`) and the plugins that are not methods or
adapters: SuRe (:mod:`surecl.plugins.sure`), the step log (:mod:`surecl.plugins.steplog`) and
fault injection (:mod:`surecl.plugins.faults`)."""

from surecl.plugins.base import NoConfig, Plugin, Plugins, RunContext, Stage, StepRecord

__all__ = ["NoConfig", "Plugin", "Plugins", "RunContext", "Stage", "StepRecord"]
