"""Math verifier: the last boxed answer against a short gold label, with exact numbers.

`score(response, reference)` extracts the final `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`)
of the response and decides whether it equals the gold label. math-verify 0.9.0 parses both
sides; the comparison policy is ours and stricter (see docs/rewards.md, "Math"):

- Numbers are exact. Decimal literals are read as the exact fractions they denote ("0.5" is
  1/2, "0.1000004" is 1000004/10^7), expressions are evaluated (`2004!` becomes an integer), and
  two rationals are equal only when identical: 0.1 != 0.1000004, 1/2004! != 1/2006!,
  0.333333 != 1/3. A rational never equals an irrational; two irrational closed forms are equal
  when sympy simplifies their difference to zero or they agree to 40 significant digits.
- A truncated final box (no closing brace), an answer math-verify cannot parse, or an answer
  longer than `max_answer_chars` scores 0 ("unparseable"); a parse that succeeds only on a
  prefix is prevented by requiring balanced braces and brackets.
- Relations and sets: "x = 3" equals "3" (an assignment to one variable unwraps to its value,
  either side); "2x = 6" does not equal "3"; "x = 3" does not equal "y = 3". A one-variable
  inequality equals its solution set ("x < 2" == "(-\\infty, 2)", either side). A braced set
  equals a bare comma list with the same elements in any order ("\\{1,2\\}" == "2, 1");
  an ordered tuple "(1,2,3)" needs the same order; an interval needs the same endpoints and
  openness. A one-element set equals its element ("\\{3\\}" == "3").
- A percent sign is ignored on both sides ("50\\%" == "50").

Every comparison runs in a child process (isolation.py) with a hard deadline and a memory
limit, so towers like 9^{9^{9^9}} or (10^{10})! score 0 with reason "timeout" or "crash" and
never hang the caller, from any thread.
"""

from __future__ import annotations

import re

from recipe_jax.rewards import isolation
from recipe_jax.rewards.score import Score

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_LIMIT_BYTES = 2 << 30
DEFAULT_MAX_ANSWER_CHARS = 1000
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_PERCENT = re.compile(r"\\?%")
_INTEGER = re.compile(r"[-+]?\d{1,60}")
_BRACE_OR_ESCAPE = re.compile(r"\\.|[{}]", re.DOTALL)  # an escape pair is skipped whole
# Imported once by the isolation zygote, so a check does not pay for them inside its deadline.
_ENGINE_MODULES = ("sympy", "math_verify", "math_verify.grader", "math_verify.parser")


def score(response: str, reference: str | int, *, timeout_s: float = DEFAULT_TIMEOUT_S,
          memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
          max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS) -> Score:
  """Scores the final boxed answer of `response` against the gold label `reference`.

  Args:
    response: the model's full response text.
    reference: the gold answer as LaTeX without `$` ("\\frac{1}{2}", "(-\\infty, 2)", "12");
      a `$...$` wrapper or a `\\boxed{}` around it is accepted. An int is read as its digits.
    timeout_s: wall-clock deadline of the equivalence check (parse and compare).
    memory_limit_bytes: address-space limit of the process doing the check.
    max_answer_chars: longer boxed answers are "unparseable" without being parsed.

  Returns:
    Score 1.0 "correct", or 0.0 with reason "no_boxed_answer", "unparseable: ...",
    "not_equivalent", "timeout" or "crash: ...".
  """
  if not isinstance(response, str):
    raise TypeError(f"response must be a str, got {type(response).__name__}")
  gold = normalize_reference(reference)
  answer, status = extract_boxed(response)
  if status == "none":
    return Score.wrong("no_boxed_answer")
  if status == "unclosed":
    return Score.wrong("unparseable: final \\boxed is not closed (truncated)")
  if len(answer) > max_answer_chars:
    return Score.wrong(f"unparseable: answer longer than {max_answer_chars} characters",
                       answer_chars=len(answer))
  if not answer.strip():
    return Score.wrong("unparseable: empty box")
  if not _balanced_brackets(answer):
    return Score.wrong("unparseable: unbalanced brackets", answer=answer[:200])
  plain = _PERCENT.sub("", answer).strip()
  if _INTEGER.fullmatch(plain) and _INTEGER.fullmatch(gold):
    # two integer literals: equal exactly when their values are; no parser, no child process
    same = int(plain) == int(gold)
    return Score.correct(answer=answer[:200]) if same else Score.wrong("not_equivalent", answer=answer[:200])
  outcome = isolation.run_isolated(
      equivalence_verdict, answer, gold, timeout_s=timeout_s,
      memory_limit_bytes=memory_limit_bytes, preload=_ENGINE_MODULES, warmup=warm_up_engine)
  details = {"answer": answer[:200], "seconds": round(outcome.seconds, 4)}
  if outcome.status == "timeout":
    return Score.wrong("timeout", **details)
  if outcome.status in ("crash", "error"):
    return Score.wrong(f"crash: {outcome.detail[:200]}", **details)
  reason = outcome.value
  if reason == "correct":
    return Score.correct(**details)
  return Score.wrong(reason, **details)


def normalize_reference(reference: str | int) -> str:
  """The gold label as bare LaTeX: strips `$...$` and a `\\boxed{}` wrapper and percent signs."""
  if isinstance(reference, bool) or not isinstance(reference, (str, int)):
    raise TypeError(f"math reference must be a str or int, got {type(reference).__name__}: "
                    f"{reference!r}")
  gold = str(reference).strip()
  if gold.startswith("$") and gold.endswith("$"):
    gold = gold.strip("$").strip()
  boxed, status = extract_boxed(gold)
  if status == "ok":
    gold = boxed
  gold = _PERCENT.sub("", gold).strip()
  if not gold:
    raise ValueError(f"math reference is empty: {reference!r}")
  return gold


def extract_boxed(text: str) -> tuple[str, str]:
  """The content of the last `\\boxed{...}` / `\\fbox{...}` / `\\boxed x` in `text`.

  Returns (content, status) with status "ok", "none" (no box at all) or "unclosed" (the last
  box has no matching closing brace, as in a truncated response). Escaped braces `\\{ \\}`
  inside the box do not count for nesting. Linear in the length of the text.
  """
  start, command = -1, ""
  for name in _BOX_COMMANDS:
    position = text.rfind(name)
    while position >= 0 and text[position + len(name):position + len(name) + 1].isalpha():
      position = text.rfind(name, 0, position)  # e.g. \boxedx is another command
    if position > start:
      start, command = position, name
  if start < 0:
    return "", "none"
  i = start + len(command)
  while i < len(text) and text[i] == " ":
    i += 1
  if i >= len(text):
    return "", "unclosed"
  if text[i] != "{":  # \boxed 5: one token up to whitespace or '$'
    match = re.match(r"[^\s$]+", text[i:])
    return (match.group(0).rstrip(".,;"), "ok") if match else ("", "unclosed")
  depth = 0
  for match in _BRACE_OR_ESCAPE.finditer(text, i):
    token = match.group(0)
    if token == "{":
      depth += 1
    elif token == "}":
      depth -= 1
      if depth == 0:
        return text[i + 1:match.start()], "ok"
  return "", "unclosed"


def _balanced_brackets(answer: str) -> bool:
  """Braces nest properly and round/square brackets open and close in equal numbers.

  Intervals like "(1, 2]" mix the kinds, so only totals are compared for them.
  """
  depth = 0
  i = 0
  while i < len(answer):
    if answer[i] == "\\":
      i += 2
      continue
    if answer[i] == "{":
      depth += 1
    elif answer[i] == "}":
      depth -= 1
      if depth < 0:
        return False
    i += 1
  unescaped = re.sub(r"\\[{}]", "", answer)
  opened = unescaped.count("(") + unescaped.count("[")
  closed = unescaped.count(")") + unescaped.count("]")
  return depth == 0 and opened == closed


# ----------------------------------------------------------------------------------------------
# The equivalence check. Runs inside an isolated child process (sympy can hang or blow up);
# math-verify and sympy are imported here, lazily, so importing this module stays cheap.
# ----------------------------------------------------------------------------------------------

_DECIMAL_LITERAL = re.compile(r"(?<![\d.,])(\d*)\.(\d+)(?![\d.])")
_IRRATIONAL_AGREEMENT_DIGITS = 40


def equivalence_verdict(answer: str, gold: str) -> str:
  """"correct", "not_equivalent" or "unparseable: ..." for one boxed answer and gold label."""
  try:
    gold_expr = _parse(gold)
  except Exception:  # noqa: BLE001 - compared as text below
    gold_expr = None
  try:
    answer_expr = _parse(_PERCENT.sub("", answer))
  except Exception as error:  # noqa: BLE001 - sympy raises many kinds
    return f"unparseable: {type(error).__name__}"
  if gold_expr is None:  # a gold label sympy cannot read: normalized text must match
    return "correct" if _plain_text(answer) == _plain_text(gold) else "not_equivalent"
  if answer_expr is None:
    return "unparseable: math-verify cannot parse the answer"
  try:
    return "correct" if _equal(gold_expr, answer_expr) else "not_equivalent"
  except Exception as error:  # noqa: BLE001
    return f"not_equivalent: comparison failed ({type(error).__name__})"


def warm_up_engine():
  """Fills math-verify's and sympy's caches once per isolation zygote (run before forking)."""
  for gold, answer in (("\\frac{1}{2}", "0.5"), ("(-\\infty, 2)", "x < 2"), ("\\{1,2\\}", "2, 1"),
                       ("x = 3", "3"), ("\\text{A}", "A"), ("\\sqrt{3}", "3^{1/2}"),
                       ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "(1, 2)")):
    equivalence_verdict(answer, gold)


def _parse(latex: str):
  """The sympy object of `latex` with decimal literals made exact and evaluated, or None."""
  import math_verify
  import math_verify.grader
  import math_verify.parser
  import sympy

  math_verify.grader.TIMEOUT_WARNING_SHOWN = True  # the deadline is ours (isolation.py)
  math_verify.parser.TIMEOUT_WARNING_SHOWN = True
  exact = _DECIMAL_LITERAL.sub(
      lambda m: "{\\frac{%s}{1%s}}" % ((m.group(1) + m.group(2)).lstrip("0") or "0",
                                      "0" * len(m.group(2))), latex)
  parsed = math_verify.parse(
      "\\boxed{" + exact + "}",
      extraction_config=[math_verify.LatexExtractionConfig(boxed_match_priority=0)],
      fallback_mode="no_fallback", extraction_mode="first_match", parsing_timeout=None)
  parsed = [p for p in parsed if isinstance(p, (sympy.Basic, sympy.MatrixBase))]
  if not parsed:
    return None
  expr = parsed[0]
  floats = expr.atoms(sympy.Float)
  if floats:  # literals the regex above left alone (e.g. "1,000.5")
    expr = expr.xreplace({f: sympy.Rational(str(f)) for f in floats})
  try:
    return expr.doit()
  except Exception:  # noqa: BLE001 - sympy raises many kinds; keep the unevaluated form
    return expr


def _plain_text(latex: str) -> str:
  text = re.sub(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}", r"\1", latex)
  return re.sub(r"[\s$.]", "", text).lower()


def _is_relation(expr) -> bool:
  import sympy
  return isinstance(expr, (sympy.Rel, sympy.And, sympy.Or))


def _assignment_value(expr):
  """`v` for `symbol = v`, else None."""
  import sympy
  if isinstance(expr, sympy.Eq) and isinstance(expr.lhs, sympy.Symbol):
    return expr.rhs
  return None


def _as_set(relation):
  import math_verify.grader as grader
  try:
    return grader.unwrap_fcs(relation).as_set()
  except Exception:  # noqa: BLE001 - more than one variable, or not solvable
    return None


def _relations_as_set(expr, other):
  """"x < 2 or x > 3" (parsed as a set of relations) as one set, when compared with a set."""
  import sympy
  if (isinstance(expr, sympy.FiniteSet) and isinstance(other, (sympy.Interval, sympy.Union))
      and all(_is_relation(e) for e in expr)):
    parts = [_as_set(e) for e in expr]
    if all(part is not None for part in parts):
      return sympy.Union(*parts)
  return expr


def _equal(gold, pred) -> bool:
  """Our equivalence policy on parsed (and evaluated, exact) sympy objects."""
  import math_verify.grader as grader
  import sympy

  gold, pred = _relations_as_set(gold, pred), _relations_as_set(pred, gold)
  if _is_relation(gold) != _is_relation(pred):  # "x = 3" vs "3", "x < 2" vs "(-oo, 2)"
    relation, other = (gold, pred) if _is_relation(gold) else (pred, gold)
    value = _assignment_value(relation)
    if value is None and isinstance(other, sympy.Set):
      value = _as_set(relation)
    if value is None:
      return False
    gold, pred = (value, pred) if relation is gold else (gold, value)
  if _is_relation(gold) and _is_relation(pred):
    if gold == pred:
      return True
    return bool(grader.sympy_compare_relational(gold, pred, 6, 15))

  if isinstance(gold, sympy.FiniteSet) and len(gold) == 1 and not isinstance(pred, sympy.Set):
    gold = next(iter(gold))
  if isinstance(pred, sympy.FiniteSet) and len(pred) == 1 and not isinstance(gold, sympy.Set):
    pred = next(iter(pred))
  if isinstance(gold, sympy.FiniteSet) and isinstance(pred, sympy.FiniteSet):
    return _matched_unordered(list(gold), list(pred))
  if isinstance(gold, sympy.Union) and isinstance(pred, sympy.Union):
    return _matched_unordered(list(gold.args), list(pred.args))
  if isinstance(gold, sympy.Interval) and isinstance(pred, sympy.Interval):
    return (gold.left_open == pred.left_open and gold.right_open == pred.right_open
            and _equal(gold.start, pred.start) and _equal(gold.end, pred.end))
  if isinstance(gold, sympy.Tuple) and isinstance(pred, sympy.Tuple):
    return len(gold) == len(pred) and all(_equal(g, p) for g, p in zip(gold, pred))
  if isinstance(gold, (sympy.Set, sympy.Tuple)) or isinstance(pred, (sympy.Set, sympy.Tuple)):
    return gold == pred  # different kinds of collection (set vs tuple vs interval)
  if isinstance(gold, sympy.MatrixBase) or isinstance(pred, sympy.MatrixBase):
    if not (isinstance(gold, sympy.MatrixBase) and isinstance(pred, sympy.MatrixBase)):
      return False
    return gold.shape == pred.shape and all(_equal(g, p) for g, p in zip(gold, pred))
  if isinstance(gold, sympy.Expr) and isinstance(pred, sympy.Expr):
    return _scalar_equal(gold, pred)
  return bool(grader.sympy_expr_eq(gold, pred, 6, 15, allow_set_relation_comp=True, strict=True))


def _matched_unordered(golds: list, preds: list) -> bool:
  if len(golds) != len(preds):
    return False
  remaining = list(preds)
  for g in golds:
    for i, p in enumerate(remaining):
      if _equal(g, p):
        del remaining[i]
        break
    else:
      return False
  return True


def _scalar_equal(gold, pred) -> bool:
  """Exact equality of two scalar expressions (no float tolerance)."""
  import math_verify.grader as grader
  import sympy

  if gold == pred:
    return True
  if gold.is_Rational and pred.is_Rational:
    return False  # two different exact numbers
  if isinstance(gold, sympy.Symbol) or isinstance(pred, sympy.Symbol):
    return bool(grader.sympy_compare_symbols(gold, pred))  # "\text{Monday}" vs "Monday"
  try:
    if sympy.simplify(gold - pred) == 0:
      return True
  except Exception:  # noqa: BLE001
    return False
  if gold.free_symbols or pred.free_symbols or gold.is_Rational or pred.is_Rational:
    return False  # a rational never equals an irrational; expressions need a proof
  digits = _IRRATIONAL_AGREEMENT_DIGITS
  try:
    difference = sympy.N(gold - pred, digits + 20)
    size = max(abs(sympy.N(gold, digits + 20)), 1)
    return bool(abs(difference) <= size * sympy.Rational(1, 10**digits))
  except (TypeError, ValueError):  # complex or non-numeric values that did not simplify
    return False
