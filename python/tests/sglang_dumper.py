"""SGLang's dumper for the tests: python/sglang/srt/debug_utils/dumper.py of the sglang wheel that
ci/setup installs, pinned and without its dependencies, into /opt/sglang-0.5.14 (DFLASH_SGLANG_DIR
names another folder). The file is loaded alone, by path: it imports only the standard library
and torch, and its framework plugins find no SGLang runtime, so nothing else of SGLang is imported
and nothing is fetched.

Debian 12's torch (1.13) lacks two torch 2 APIs the dumper calls: Tensor.untyped_storage (its
view check before torch.save) and forward pre-hooks with kwargs (its non-intrusive hooks). On such
a torch, load() supplies them: storage() answers the view check, and a pre-hook registered with
kwargs sees the positional arguments only (the drafter's modules here take their tensors
positionally; the root module's kwargs go through the dumper's own forward wrapper).
"""
import importlib.util
import inspect
import os
import sys

import torch

VERSION = "0.5.14"
DIR = os.environ.get("DFLASH_SGLANG_DIR", f"/opt/sglang-{VERSION}")
FILE = os.path.join(DIR, "sglang", "srt", "debug_utils", "dumper.py")
_MODULE = "sglang_dumper_under_test"


def installed_version():
    """The version of the sglang wheel in DIR, from its METADATA (None when absent)."""
    metadata = os.path.join(DIR, f"sglang-{VERSION}.dist-info", "METADATA")
    if not os.path.exists(metadata):
        return None
    with open(metadata) as f:
        for line in f:
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def _torch_1_stand_ins():
    if not hasattr(torch.Tensor, "untyped_storage"):
        torch.Tensor.untyped_storage = lambda self: self.storage()
    register = torch.nn.Module.register_forward_pre_hook
    if "with_kwargs" not in inspect.signature(register).parameters:
        def register_with_kwargs(self, hook, *, with_kwargs=False):
            return register(self, (lambda module, args: hook(module, args, {})) if with_kwargs else hook)
        torch.nn.Module.register_forward_pre_hook = register_with_kwargs


def load():
    """The dumper module (loaded once per process)."""
    if _MODULE in sys.modules:
        return sys.modules[_MODULE]
    if installed_version() != VERSION or not os.path.exists(FILE):
        raise AssertionError(f"SGLang's dumper (sglang {VERSION}) is not installed in {DIR}: run ci/setup")
    _torch_1_stand_ins()
    spec = importlib.util.spec_from_file_location(_MODULE, FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE] = module
    spec.loader.exec_module(module)
    return module


def start(dump_dir, *, non_intrusive_mode="all", filter=None):
    """A fresh dumper writing to dump_dir/run (no console log, no HTTP server), configured as
    DUMPER_ENABLE=1 DUMPER_DIR=dump_dir DUMPER_EXP_NAME=run DUMPER_NON_INTRUSIVE_MODE=...
    DUMPER_FILTER=... would."""
    module = load()
    return module._Dumper(config=module.DumperConfig(enable=True, dir=dump_dir, exp_name="run", filter=filter,
                                                     enable_output_console=False,
                                                     non_intrusive_mode=non_intrusive_mode, server_port="-1"))


def add_tp_plugin(tp_rank, tp_size):
    """Has the dumper write `sglang_parallel_info` {tp_rank, tp_size} into every meta, as its SGLang
    plugin does from SGLang's parallel state (which these tests do not run)."""
    module = load()

    class TestParallelState(module._FrameworkPlugin):
        name = "sglang"

        def collect_parallel_info(self):
            return {"tp_rank": tp_rank, "tp_size": tp_size}

        def convert_value(self, value, *, skip_forward_batch):
            return None

        def detect_layer_id(self, module):
            return None

    module._plugins.append(TestParallelState())
