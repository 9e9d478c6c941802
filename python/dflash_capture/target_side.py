"""The target's side of a capture (fixture format v2, docs/spec/fixture-format.md "The target's
side"): per propose, the target's greedy tokens at the block positions and, from a target module,
its top-k logits there, so that dflash-harness measures acceptance (docs/acceptance.md).

Two sources, both teacher-forced on the target's own continuation:
  TokenTarget   a token file: the target's token at each absolute position (shared by every
                sequence, as --hidden is); the anchor of a propose at `start` is the token there,
                the target's tokens for block positions start+1..start+B-1 are the file's.
  ModuleTarget  a target module (forward(input_ids [1, N]) -> logits [1, N, V]): each sequence is a
                seeded random prompt continued greedily by the target; one teacher-forced forward
                over the sequence gives, at positions start..start+B-2, the logits that predict block
                positions start+1..start+B-1: their argmax (the target's tokens) and top-k.
"""
import torch

from .errors import CaptureError
from .module_output import output_tensor
from .safetensors_io import read_safetensors


def load_target_tokens(path, vocab_size):
    """The 1-D token ids of a safetensors file (its only tensor, or 'target_tokens'), each inside
    [0, vocab_size)."""
    tensors = read_safetensors(path)
    if "target_tokens" in tensors:
        t = tensors["target_tokens"]
    elif len(tensors) == 1:
        t = next(iter(tensors.values()))
    else:
        raise CaptureError(f"{path}: holds {len(tensors)} tensors and none is named 'target_tokens'")
    if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
        raise CaptureError(f"{path}: target tokens must be a 1-D I32 or I64 tensor (one token per position), got "
                           f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}")
    bad = ((t < 0) | (t >= vocab_size)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise CaptureError(f"{path}: target token {int(t[i])} at position {i} is outside [0, vocab_size {vocab_size})")
    return t.to(torch.int64)


class TokenTarget:
    """The target's tokens from a file, one per absolute position."""

    def __init__(self, tokens, path):
        self.tokens, self.path = tokens, path

    def _need(self, last):
        if last >= self.tokens.shape[0]:
            raise CaptureError(f"{self.path}: holds {self.tokens.shape[0]} target tokens; the capture needs "
                               f"positions up to {last}")

    def anchor(self, seq, start):
        self._need(start)
        return int(self.tokens[start])

    def side(self, seq, start, B):
        self._need(start + B - 1)
        return {"tokens": self.tokens[start + 1:start + B].to(torch.int32)}


class ModuleTarget:
    """A target module run teacher-forced; `generator` seeds each sequence's prompt of `prompt`
    tokens, `topk` is how many of its logits are kept per position."""

    def __init__(self, model, vocab_size, generator, *, prompt=4, topk=8):
        if prompt < 1 or not 1 <= topk <= vocab_size:
            raise CaptureError(f"--target-prompt must be >= 1 and --target-topk in [1, vocab_size {vocab_size}], "
                               f"got {prompt} and {topk}")
        self.model, self.vocab_size, self.generator = model, vocab_size, generator
        self.prompt, self.topk = prompt, topk
        self.sequences = {}  # seq -> token ids so far

    def _device(self):
        return next(self.model.parameters()).device

    def _logits(self, tokens):
        ids = tokens.to(self._device()).unsqueeze(0)
        with torch.no_grad():
            logits = output_tensor(self.model(ids), "target module output", "logits")
        if list(logits.shape) != [1, ids.shape[1], self.vocab_size]:
            raise CaptureError(f"target module: returned logits of shape {list(logits.shape)} for {ids.shape[1]} "
                               f"tokens; expected [1, {ids.shape[1]}, vocab_size {self.vocab_size}]")
        if not torch.isfinite(logits).all():
            raise CaptureError("target module: returned NaN or Inf logits")
        return logits[0].cpu()

    def _tokens(self, seq, length):
        """The sequence's first `length` tokens: its seeded prompt, continued greedily."""
        tokens = self.sequences.get(seq)
        if tokens is None:
            tokens = torch.randint(0, self.vocab_size, (self.prompt,), generator=self.generator)
        while tokens.shape[0] < length:
            nxt = torch.argmax(self._logits(tokens)[-1])  # the first index among equal maxima
            tokens = torch.cat([tokens, nxt.reshape(1).cpu()])
        self.sequences[seq] = tokens
        return tokens[:length]

    def anchor(self, seq, start):
        return int(self._tokens(seq, start + 1)[start])

    def side(self, seq, start, B):
        tokens = self._tokens(seq, start + B - 1)
        rows = self._logits(tokens)[start:start + B - 1].to(torch.float32)
        values, ids = torch.topk(rows, self.topk, dim=-1)
        return {"tokens": torch.argmax(rows, dim=-1).to(torch.int32), "topk_values": values.contiguous(),
                "topk_ids": ids.to(torch.int32).contiguous()}


def check_side(side, B, vocab_size, where):
    """A target side for a propose of width B: tokens [B-1] inside the vocabulary, top-k values and
    ids [B-1, k] together, each token the id of a largest value of its row."""
    tokens = side.get("tokens")
    if not isinstance(tokens, torch.Tensor) or list(tokens.shape) != [B - 1]:
        shape = list(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise CaptureError(f"{where}: target tokens must be [{B - 1}] (B-1), got {shape}")
    if ((tokens < 0) | (tokens >= vocab_size)).any():
        raise CaptureError(f"{where}: a target token is outside [0, vocab_size {vocab_size})")
    values, ids = side.get("topk_values"), side.get("topk_ids")
    if (values is None) != (ids is None):
        raise CaptureError(f"{where}: target top-k needs both values and ids")
    if values is None:
        return
    if values.dim() != 2 or values.shape[0] != B - 1 or list(ids.shape) != list(values.shape):
        raise CaptureError(f"{where}: target top-k values {list(values.shape)} and ids {list(ids.shape)} must both "
                           f"be [{B - 1}, k]")
    top = values.max(dim=-1, keepdim=True).values
    hit = ((ids == tokens.unsqueeze(-1).to(ids.dtype)) & (values == top)).any(dim=-1)
    if not hit.all():
        raise CaptureError(f"{where}: row {int((~hit).nonzero()[0, 0])}'s target token is not the id of a largest "
                           f"top-k value")
