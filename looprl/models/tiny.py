"""The `tiny` model: a small Llama-style model and byte-level BPE tokenizer that looprl builds itself.

Built offline and deterministically (same bytes on every build): the tokenizer is trained on a
synthetic corpus of arithmetic problems, calculator tool calls, tool outputs, answers, chat
glue (conversations rendered with looprl's ChatML tool template) and a few hundred common
English words; the model is randomly initialised from a fixed seed. It knows nothing until it is
trained (SFT on synthetic traces, then RL): it exists for tests and the CPU demo.
"""

from __future__ import annotations

import ast
import json
import operator
import random
from pathlib import Path
from typing import Any

import torch

from looprl.models.cache import build_atomically, cache_root
from looprl.rendering.templates import CHATML_TOOLS_TEMPLATE

TINY_NAME = "tiny-v4"  # bump the suffix whenever the build below changes its output
SEED = 1234
MAX_VOCAB_SIZE = 1536  # an upper bound: merges run out first
HIDDEN_SIZE = 192
NUM_LAYERS = 4
NUM_HEADS = 4
NUM_KV_HEADS = 2
INTERMEDIATE_SIZE = 4 * HIDDEN_SIZE
MAX_POSITIONS = 2048
INIT_STD = 0.02

EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (EOT, IM_START, IM_END)  # ids 0, 1, 2
TOOL_TAGS = ("<tool_call>", "</tool_call>")  # ordinary (non-special) added tokens, one id each

CALCULATE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression and return its value.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": "The expression, e.g. (12 + 3) * 4.",
                }
            },
            "required": ["expression"],
        },
    },
}
"""The calculator tool schema the corpus uses (OpenAI function format)."""

_WORDS_TEXT = """
the be to of and a in that have I it for not on with he as you do at this but his by from they
we say her she or an will my one all would there their what so up out if about who get which go
me when make can like time no just him know take people into year your good some could them see
other than then now look only come its over think also back after use two how our work first well
way even new want because any these give day most us is are was were has had been being number
numbers total sum product difference result answer answers question problem problems step steps
first second third next last each every many much more less few several box boxes apple apples
pencil pencils book books train car cars hour hours minute minutes day days week weeks price cost
dollar dollars cent cents shop store buy buys bought sell sells sold spend spent left remain
remains share shares equal equally group groups row rows column columns page pages student
students class school teacher friend friends farmer sheep cow cows egg eggs basket baskets bag
bags coin coins ticket tickets seat seats bus city road km mile miles meter meters liter liters
kilogram gram water milk bread cake cookie cookies candy chocolate orange oranges banana bananas
pie piece pieces part half quarter double triple twice times plus minus multiply multiplied
divide divided add added subtract subtracted compute calculate evaluate find solve check verify
tool tools call calls calling function functions expression expressions value values argument
arguments name names result results error errors invalid unknown missing please thank thanks
yes sure okay right wrong correct true false because therefore so thus hence let me us think
carefully start begin end final finally now here there where when why how what which who whose
small big large long short high low fast slow early late old young hot cold open close full
empty same different other another both either neither each per rate speed distance area
height width length weight age year month morning evening night today tomorrow yesterday house
room door window table chair garden tree trees flower flowers river lake sea mountain field
work works worked working play plays played read reads write writes wrote written run runs ran
walk walks walked give gives gave keep keeps kept put puts get gets got make makes made
"""
_WORDS = sorted(set(_WORDS_TEXT.split()))

_PROBLEM_FORMS = (
    "Compute {e}.",
    "What is {e}?",
    "Calculate {e}.",
    "Evaluate {e}.",
    "Find the value of {e}.",
    "Use the calculator to work out {e}.",
)

_WORD_PROBLEMS = (
    (
        "A farmer has {a} sheep and buys {b} more. How many sheep does the farmer have now?",
        "{a} + {b}",
    ),
    ("Each box holds {a} pencils. How many pencils are in {b} boxes?", "{a} * {b}"),
    ("Tom had {a} dollars and spent {b} dollars. How many dollars are left?", "{a} - {b}"),
    ("A train travels {a} km every hour for {b} hours. How far does it go?", "{a} * {b}"),
    (
        "A shop sold {a} apples in the morning and {b} in the evening. How many in total?",
        "{a} + {b}",
    ),
    ("A school has {a} students in each of {b} classes. How many students are there?", "{a} * {b}"),
)


def _expression(rng: random.Random) -> str:
    """A random arithmetic expression with 2-4 operands of 1-4 digits."""

    def num() -> str:
        return str(rng.randint(0, 10 ** rng.randint(1, 4) - 1))

    parts = [num()]
    for _ in range(rng.randint(1, 3)):
        parts += [rng.choice(["+", "-", "*", "*", "/"]), num()]
    if len(parts) >= 5 and rng.random() < 0.4:
        parts = ["(" + " ".join(parts[:3]) + ")"] + parts[3:]
    return " ".join(parts)


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _evaluate(node: ast.expr) -> float:
    """Value of a parsed expression made of numbers, + - * / and parentheses."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError(f"unsupported expression node {ast.dump(node)}")


def _value(expression: str) -> str:
    """The value of a generated expression as a calculator would print it, or an error line."""
    try:
        v = _evaluate(ast.parse(expression, mode="eval").body)
    except ZeroDivisionError:
        return "Error: division by zero"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else f"{v:.6g}"
    return str(v)


def _conversation(rng: random.Random) -> list[dict[str, Any]]:
    """One synthetic chat: a problem, zero to two calculator calls with results, an answer."""
    if rng.random() < 0.3:
        text, form = rng.choice(_WORD_PROBLEMS)
        a, b = rng.randint(2, 999), rng.randint(2, 99)
        problem, expr = text.format(a=a, b=b), form.format(a=a, b=b)
    else:
        expr = _expression(rng)
        problem = rng.choice(_PROBLEM_FORMS).format(e=expr)
    msgs: list[dict[str, Any]] = []
    if rng.random() < 0.3:
        msgs.append({"role": "system", "content": "Solve the problem. Use the calculate tool."})
    msgs.append({"role": "user", "content": problem})
    value = _value(expr)
    for _ in range(rng.choice([0, 1, 1, 1, 2])):
        args = {"expression": expr if rng.random() < 0.9 else expr.replace(" ", "")}
        lead = rng.choice(["", "", "Let me use the calculator.", "I will compute this."])
        call = {"type": "function", "function": {"name": "calculate", "arguments": args}}
        msgs.append({"role": "assistant", "content": lead, "tool_calls": [call]})
        msgs.append({"role": "tool", "content": value})
    answer = rng.choice(["The answer is {v}.", "So {e} = {v}. The answer is {v}.", "{v}"])
    msgs.append({"role": "assistant", "content": answer.format(v=value, e=expr)})
    return msgs


def synthetic_corpus(seed: int = SEED, conversations: int = 1500) -> list[str]:
    """The tokenizer's training text, as lines; the same seed gives the same corpus.

    Special tokens are removed (the trainer must not learn merges across them); each rendered
    conversation contributes the text between them.
    """
    from transformers.utils.chat_template_utils import render_jinja_template

    rng = random.Random(seed)
    chats = [_conversation(rng) for _ in range(conversations)]
    # (returns the rendered texts and generation indices, though annotated `-> str`)
    result: Any = render_jinja_template(
        chats, tools=[CALCULATE_TOOL], chat_template=CHATML_TOOLS_TEMPLATE
    )
    rendered: list[str] = result[0]
    lines: list[str] = []
    for text in rendered:
        for special in SPECIAL_TOKENS:
            text = text.replace(special, "\0")
        lines.extend(piece for piece in text.split("\0") if piece)
    words = list(_WORDS)
    for _ in range(400):
        rng.shuffle(words)
        lines.append(" ".join(words[: rng.randint(5, 15)]).capitalize() + rng.choice(".?!"))
    lines.append(" ".join(_WORDS))
    lines.append(json.dumps(CALCULATE_TOOL))
    return lines


def build_tokenizer(seed: int = SEED) -> Any:
    """Train the byte-level BPE tokenizer and wrap it for transformers.

    Digits are split one per token: ten digit tokens that every number shares are each seen
    often, so a tiny model learns to copy numbers (into a tool call, out of a tool result) in a
    few hundred steps; with one token per 3-digit group it would need ten times more.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=MAX_VOCAB_SIZE - len(TOOL_TAGS),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(seed), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=EOT,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
        chat_template=CHATML_TOOLS_TEMPLATE,
    )


def tiny_config(vocab_size: int, tokenizer: Any) -> Any:
    """The Llama-style config of the tiny model (GQA, tied embeddings, RoPE theta 10000)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        initializer_range=INIT_STD,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(EOT),
        dtype="float32",
    )


def _init_weights(model: torch.nn.Module, seed: int) -> None:
    """Initialise every parameter from one seeded generator, in name order (build-independent).

    Norm weights are 1; other matrices N(0, 0.02), with the residual output projections
    (`o_proj`, `down_proj`) scaled by 1/sqrt(2 * layers) as in GPT-2.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "norm" in name:
                param.fill_(1.0)
                continue
            std = INIT_STD
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                std /= (2 * NUM_LAYERS) ** 0.5
            param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * std)


def build_tiny(path: str | Path, seed: int = SEED) -> Path:
    """Build the tiny model and tokenizer into `path` (a normal Hugging Face directory)."""
    from transformers import GenerationConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(seed)
    config = tiny_config(len(tokenizer), tokenizer)
    model = LlamaForCausalLM(config)
    _init_weights(model, seed)
    eos_ids = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(EOT)]
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=config.pad_token_id, bos_token_id=None
    )
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a 10 MB file needs no "Writing model shards" bar
    try:
        model.save_pretrained(path)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(path)
    return path


def tiny_path() -> Path:
    """The cached tiny model directory (`<cache>/tiny-v1`), built on first use (a few seconds)."""
    return build_atomically(cache_root() / TINY_NAME, build_tiny)
