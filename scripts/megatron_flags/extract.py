"""Extracts every flag of Megatron-LM's pretrain argument parser into a TSV (run once per pinned version).

Usage: git -C MEGATRON_LM archive v0.20.0 megatron | tar -x -C /tmp/mlm
       python3 scripts/megatron_flags/extract.py tests/training/data/megatron_lm_0.20_flags.tsv
(the checkout is expected at /tmp/eco_mlm; edit sys.path below). Megatron's argument groups are partly
generated from dataclasses, so the parser is built by importing megatron.training.arguments with
stub modules standing in for torch, numpy, Transformer Engine and the other heavy dependencies
(nothing is executed beyond the module imports and add_megatron_arguments). Columns: flag,
Megatron's group, switch|value|list, default, help (shortened). src/training/megatron_flags.def
then classifies every flag; its test compares the two.
"""
# Builds Megatron-LM's pretrain argument parser with stub modules for the heavy dependencies
import sys, typing, types, importlib.abc, importlib.machinery
from unittest import mock

STUB_ROOTS = {"torch","numpy","transformer_engine","apex","einops","flash_attn","triton","packaging_x","nvidia_resiliency_ext","tensorstore","zarr","wandb","tqdm","safetensors","tiktoken","sentencepiece","transformers","regex","nltk","onelogger","one_logger","modelopt","emerging_optimizers","psutil","multistorageclient","flashinfer","mamba_ssm","causal_conv1d","nvtx","cupy","deep_ep","grouped_gemm","msgpack","numba","pynvml","setuptools","opentelemetry","datasets","scipy","megatron_fsdp","nv_one_logger","tensorboard","tokenizers","mcore_adapter","hybrid_ep","pydantic","hydra","omegaconf","lightning","pkg_resources","wget","ftfy","blobfile","aiohttp","jinja2","httpx","nemo","yaml"}

class Anything:
    def __init__(self,*a,**k): pass
    def __init_subclass__(cls, **k): pass
    def __getattr__(self, n):
        if n.startswith("__") and n.endswith("__"): raise AttributeError(n)
        return Anything()
    def __call__(self,*a,**k):
        return a[0] if len(a)==1 and callable(a[0]) and not k else Anything()
    def __lt__(self,o): return False
    __gt__=__lt__
    def __le__(self,o): return True
    __ge__=__le__
    def __iter__(self): return iter(())
    def __bool__(self): return False
    def __int__(self): return 0
    def __float__(self): return 0.0
    def __index__(self): return 0
    def __add__(self,o): return Anything()
    __radd__=__sub__=__rsub__=__mul__=__rmul__=__truediv__=__rtruediv__=__floordiv__=__mod__=__pow__=__or__=__ror__=__and__=__add__
    def __getitem__(self,k): return Anything()
    def __setitem__(self,k,v): pass
    def __len__(self): return 0
    def __hash__(self): return id(self)
    def __eq__(self,o): return self is o
    def __enter__(self): return self
    def __exit__(self,*a): return False
    def __mro_entries__(self, bases): return (object,)
import typing
class Meta(typing._ProtocolMeta):
    def __getattr__(cls, n):
        if n.startswith("__") and n.endswith("__"):
            raise AttributeError(n)
        return make_stub(n)
    def __getitem__(cls, k): return cls
    def __or__(cls, o): return cls
    def __ror__(cls, o): return cls
    def __call__(cls, *a, **kw):
        if len(a)==1 and callable(a[0]) and not kw: return a[0]
        return super().__call__()
def make_stub(name):
    return Meta(name, (Anything,), {})
class StubModule(types.ModuleType):
    def __init__(self, name):
        super().__init__(name)
        self.__path__ = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    def __getattr__(self, k):
        if k == "__version__": return "99.0.0"
        if k.startswith("__") and k.endswith("__"):
            raise AttributeError(k)
        m = make_stub(k)
        setattr(self, k, m)
        return m

class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUB_ROOTS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        return StubModule(spec.name)
    def exec_module(self, m):
        pass

import pip._vendor.packaging as _p, pip._vendor.packaging.version as _pv, pip._vendor.packaging.specifiers as _ps
sys.modules["packaging"]=_p; sys.modules["packaging.version"]=_pv; sys.modules["packaging.specifiers"]=_ps
typing.override = lambda f: f
sys.meta_path.insert(0, Finder())
sys.path.insert(0, "/tmp/eco_mlm")
from megatron.training import arguments
import argparse
parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
for name in dir(arguments):
    pass
parser = arguments.add_megatron_arguments(parser)
import argparse as ap
rows = []
for g in parser._action_groups:
    for act in g._group_actions:
        if isinstance(act, ap._HelpAction): continue
        if isinstance(act, (ap._StoreTrueAction, ap._StoreFalseAction, ap._StoreConstAction)) or act.nargs == 0:
            kind = "switch"
        elif act.nargs in ("+", "*") or isinstance(act.nargs, int):
            kind = "list"
        else:
            kind = "value"
        d = act.default
        if isinstance(d, Anything) or d is ap.SUPPRESS: d = ""
        elif isinstance(d, (list, tuple)): d = " ".join(map(str, d))
        elif hasattr(d, "name") and hasattr(d, "value"): d = d.name
        d = "" if d is None else str(d)
        h = " ".join((act.help or "").split()).replace("\t", " ")
        if len(h) > 160: h = h[:157].rstrip() + "..."
        for o in act.option_strings:
            if o.startswith("--"):
                rows.append((o, g.title or "", kind, d.replace("\t"," ").replace("\n"," "), h))
seen=set()
with open(sys.argv[1] if len(sys.argv)>1 else "/dev/stdout","w") as f:
    for r in rows:
        if r[0] in seen: continue
        seen.add(r[0])
        f.write("\t".join(r)+"\n")
print(len(rows), len(seen), file=sys.stderr)
