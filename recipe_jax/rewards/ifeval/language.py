"""A small language identifier: writing system first, then stop words, no downloads.

`detect_language(text)` returns an ISO 639-1 code from `SUPPORTED_LANGUAGES`, or "und" when
the text gives no evidence (no letters, or Latin/Cyrillic/Arabic/Devanagari text none of
whose words are in a profile).

How it decides:
1. Each letter is assigned to a script by its Unicode block; the script with the most
   letters wins (Han and kana count together as one CJK script).
2. A script used by one supported language decides alone: Hangul -> ko, Thai -> th,
   Hebrew -> he, Greek -> el, Bengali -> bn, Gurmukhi -> pa, Gujarati -> gu, Tamil -> ta,
   Telugu -> te, Kannada -> kn, Malayalam -> ml. CJK is ja when kana are at least 10% of
   its characters, else zh.
3. A script shared by several supported languages (Latin, Cyrillic, Arabic, Devanagari) is
   settled by a profile per language: a set of its most frequent function words and a set of
   letters only it uses among the candidates. Score = lowercase words found in the set + words
   holding one of its letters; the highest score wins (ties go to the earlier language in
   `_PROFILES`), and a zero score gives "und".

Limits: short texts (a few words) and texts mixing languages are unreliable; languages
outside `SUPPORTED_LANGUAGES` are reported as the closest supported one or "und"; closely
related pairs with shared function words (es/pt, da/no/sv, hi/mr/ne, ru/bg) need a sentence
or more to separate. This is a rule-based stand-in for the statistical detector (langdetect)
that IFEval used; the two can disagree on short or mixed inputs.
"""

from __future__ import annotations

import collections
import functools
import unicodedata

from recipe_jax.rewards.ifeval.text import words

# Unicode blocks (inclusive) of the scripts this detector knows.
_SCRIPT_BLOCKS = (
  ("latin", 0x0041, 0x024F), ("latin", 0x1E00, 0x1EFF), ("greek", 0x0370, 0x03FF),
  ("cyrillic", 0x0400, 0x052F), ("hebrew", 0x0590, 0x05FF), ("arabic", 0x0600, 0x06FF),
  ("arabic", 0x0750, 0x077F), ("arabic", 0xFB50, 0xFDFF), ("arabic", 0xFE70, 0xFEFF),
  ("devanagari", 0x0900, 0x097F), ("bengali", 0x0980, 0x09FF), ("gurmukhi", 0x0A00, 0x0A7F),
  ("gujarati", 0x0A80, 0x0AFF), ("tamil", 0x0B80, 0x0BFF), ("telugu", 0x0C00, 0x0C7F),
  ("kannada", 0x0C80, 0x0CFF), ("malayalam", 0x0D00, 0x0D7F), ("thai", 0x0E00, 0x0E7F),
  ("hangul", 0x1100, 0x11FF), ("hangul", 0x3130, 0x318F), ("hangul", 0xAC00, 0xD7AF),
  ("kana", 0x3040, 0x30FF), ("kana", 0x31F0, 0x31FF), ("kana", 0xFF66, 0xFF9F),
  ("han", 0x3400, 0x4DBF), ("han", 0x4E00, 0x9FFF), ("han", 0xF900, 0xFAFF),
)

_SINGLE_LANGUAGE_SCRIPTS = {
  "hangul": "ko", "thai": "th", "hebrew": "he", "greek": "el", "bengali": "bn", "gurmukhi": "pa",
  "gujarati": "gu", "tamil": "ta", "telugu": "te", "kannada": "kn", "malayalam": "ml",
}

# language -> (script, function words, letters only it uses among that script's candidates)
_PROFILES: dict[str, tuple[str, str, str]] = {
  "en": ("latin", "the and of to in is are was were it that this with for on as be by not have has had "
         "you i he she we they his her their our my your an at from or but which what who will would "
         "can could should there been do does did if so than then these those them its about into", ""),
  "es": ("latin", "el la los las de del y en que es un una por con para como pero su sus al lo se no "
         "más este esta son está están fue ser hay muy también porque cuando donde sobre entre yo tú "
         "nosotros ellos le les ya", "ñ¿¡"),
  "pt": ("latin", "o a os as de do da dos das e em no na nos nas que é um uma para com por como mas "
         "seu sua não mais este esta isso são está foi ser há muito também porque quando onde sobre "
         "entre eu você nós eles ao pelo pela", "ãõ"),
  "fr": ("latin", "le la les de des du un une et en est que qui dans pour pas sur au aux avec ce cette "
         "il elle ils nous vous je sont être avoir mais ou plus se ne son sa ses leur été aussi", "œ"),
  "de": ("latin", "der die das und ist nicht ein eine einen dem den des zu mit auf für von sich auch "
         "es ich sie er wir ihr im sind war wird werden aber oder wie noch nach bei aus kann wenn "
         "dass nur", "ß"),
  "it": ("latin", "il lo la gli le di del della dei delle e è un una che per con non sono come ma più "
         "anche questo questa nel nella alla al si ha ho essere sono molto quando perché io noi loro", ""),
  "nl": ("latin", "de het een en van in is dat op te zijn met voor niet aan er ook als maar om bij "
         "door wordt dit die ik je we hij zij was worden kan naar heeft", "ĳ"),
  "sv": ("latin", "och att det som en ett på är av för med till den har inte om var jag vi de han hon "
         "men så kan från eller när också där", "å"),
  "fi": ("latin", "ja on ei se että oli hän ovat kun mutta myös tai ole joka sen niin kuin minä sinä "
         "me te he tämä siitä kanssa vain jos nyt", ""),
  "pl": ("latin", "i w na z nie się to jest że do jak o co po ale od za tak są jego jej ich dla przez "
         "czy też już może być był była tym tego", "łąęśźżćń"),
  "cs": ("latin", "a v na se je že to s z do o jako ale pro by byl není jsou jeho její tak také když "
         "už který která které", "ěřůť"),
  "ro": ("latin", "și în de la cu nu o un este că pe care sunt mai din pentru ce se ca dar fost "
         "acest această", "șțăî"),
  "tr": ("latin", "ve bir bu da de için ile çok ne o ben sen biz siz onlar gibi daha var yok ama "
         "olarak olan kadar sonra her şey", "ğış"),
  "id": ("latin", "dan yang di ke dari ini itu dengan untuk tidak ada adalah pada juga akan saya kami "
         "kita mereka atau sudah bisa dalam oleh karena", ""),
  "vi": ("latin", "và của là có không những được các một trong cho với này người đã để khi thì "
         "cũng như về đến tôi chúng", "ơưđ"),
  "sw": ("latin", "na ya wa kwa ni za la katika kama hii huo hiyo yake wao sisi mimi wewe lakini pia "
         "kuwa ana hana sana au", ""),
  "ru": ("cyrillic", "и в не на что с по это как он она они мы вы я к у же из за от для так но да "
         "его ее её был была были быть который только еще ещё", "ыэё"),
  "uk": ("cyrillic", "і в не на що з по це як він вона вони ми ви я до у та але від для так його її "
         "був була були бути який також ще", "іїєґ"),
  "bg": ("cyrillic", "и в не на че с по това как той тя те ние вие аз да за от но са е се беше бяха "
         "който която които още със", "ъ"),
  "ar": ("arabic", "في من على إلى أن هذا هذه التي الذي عن مع كان كانت لا ما هو هي و أو ثم قد بين "
         "كل بعد عند", "ةأإ"),
  "fa": ("arabic", "و در به از که این را با است برای آن می ها یک شد شده تا هم بر نیز خود هر یا اما "
         "ما شما آنها", "ژ"),
  "ur": ("arabic", "کے کی ہے میں اور سے کو نے یہ کہ پر ہیں تھا تھی بھی ایک جو کیا گیا وہ اس", "ٹڈڑںےھ"),
  "hi": ("devanagari", "है के की में और से को का एक यह पर हैं था थी भी नहीं जो कि लिए तो हम आप वह "
         "इस कर", ""),
  "mr": ("devanagari", "आहे आणि या व हे ते की करण्यासाठी मध्ये आहेत होते होता त्या त्याच्या एक "
         "पण तर म्हणून", "ळ"),
  "ne": ("devanagari", "छ र को मा हो यो पनि गर्न छन् थियो भएको गरेको तथा लागि हुन्छ उनी यस", ""),
}

SUPPORTED_LANGUAGES = frozenset(
  {*_PROFILES, *_SINGLE_LANGUAGE_SCRIPTS.values(), "ja", "zh"}
)

_FUNCTION_WORDS = {lang: frozenset(profile[1].split()) for lang, profile in _PROFILES.items()}
_MARK_LETTERS = {lang: frozenset(profile[2]) for lang, profile in _PROFILES.items()}


@functools.lru_cache(maxsize=4096)
def _script_of(char: str) -> str | None:
  """The script of a letter or combining mark, or None (not a letter, or a script not listed)."""
  if not (char.isalpha() or unicodedata.category(char).startswith("M")):
    return None
  code = ord(char)
  for script, low, high in _SCRIPT_BLOCKS:
    if low <= code <= high:
      return script
  return None


def script_counts(text: str) -> dict[str, int]:
  """Letters (and marks) per known script."""
  counts: dict[str, int] = {}
  for char, count in collections.Counter(text).items():
    script = _script_of(char)
    if script is not None:
      counts[script] = counts.get(script, 0) + count
  return counts


def normalize_language_code(code: str) -> str:
  """"ZH-cn" -> "zh", "en_US" -> "en": the two-letter primary subtag, lowercased."""
  return code.strip().lower().replace("_", "-").split("-")[0]


def _by_profile(script: str, text: str) -> str:
  tokens = collections.Counter(token.lower() for token in words(text))
  best, best_score = "und", 0
  for lang, (lang_script, _, letters) in _PROFILES.items():
    if lang_script != script:
      continue
    vocabulary, marks = _FUNCTION_WORDS[lang], _MARK_LETTERS[lang]
    score = sum(count for token, count in tokens.items() if token in vocabulary or not marks.isdisjoint(token))
    if score > best_score:
      best, best_score = lang, score
  return best


def detect_language(text: str) -> str:
  """The ISO 639-1 code of `text`'s language, or "und" (see the module docstring)."""
  counts = script_counts(text)
  if not counts:
    return "und"
  cjk = counts.pop("han", 0) + counts.get("kana", 0)
  kana = counts.pop("kana", 0)
  if cjk:
    counts["cjk"] = cjk
  script = max(counts, key=counts.get)
  if script == "cjk":
    return "ja" if kana >= 0.1 * cjk else "zh"
  if script in _SINGLE_LANGUAGE_SCRIPTS:
    return _SINGLE_LANGUAGE_SCRIPTS[script]
  return _by_profile(script, text)
