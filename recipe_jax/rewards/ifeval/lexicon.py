"""Word lists the checkers need: English stop words and an English verb lexicon.

Both are written for this package (no corpus download). `is_verb` stands in for a part-of-speech
tagger on a response's first word: a word is a verb when it is a listed base form, a listed
irregular form, or a regular inflection of a base form (-s/-es/-ies, -ed/-d/-ied, -ing with
final-e dropping and consonant doubling). Nouns that share a verb's spelling ("Water",
"Start") therefore count as verbs; modals (can, will, should, ...) do not, as in the Penn
Treebank tag set (MD, not VB*).
"""

from __future__ import annotations

import functools

STOP_WORDS = frozenset(
  """
  a about above after again against all am an and any are aren't as at be because been before
  being below between both but by can cannot can't could couldn't did didn't do does doesn't
  doing don't down during each few for from further had hadn't has hasn't have haven't having
  he he'd he'll he's her here here's hers herself him himself his how how's i i'd i'll i'm i've
  if in into is isn't it it's its itself just let's me more most mustn't my myself no nor not
  now of off on once only or other ought our ours ourselves out over own same shan't she she'd
  she'll she's should shouldn't so some such than that that's the their theirs them themselves
  then there there's these they they'd they'll they're they've this those through to too under
  until up very was wasn't we we'd we'll we're we've were weren't what what's when when's where
  where's which while who who's whom why why's will with won't would wouldn't you you'd you'll
  you're you've your yours yourself yourselves s t d ll m o re ve y
  """.split()
)

_BASE_VERBS = """
  accept achieve act add admire admit adopt advise afford agree aim allow analyze announce answer
  apologize appear apply appreciate approach approve argue arrange arrive ask assess assign assist
  assume attach attack attempt attend avoid bake balance ban bathe be bear beat become beg begin
  believe belong bend bet bind bite blame bleed bless blow boil book borrow bounce bow break breathe
  breed bring broadcast brush build burn burst bury buy calculate call calm cancel care carry carve
  cast catch cause celebrate challenge change charge chase chat check cheer chew choose chop claim
  clap clarify classify clean clear climb close collect combine come comment compare compete
  complain complete compose concentrate concern confirm connect consider consist construct contain
  continue contribute control convert convince cook copy correct cost cough count cover crack
  crawl create creep cross crush cry cure cut dance dare deal debate decide declare decorate
  define delay delete deliver demand demonstrate deny depend describe deserve design destroy
  detect determine develop dig direct disagree disappear discover discuss dislike divide do draft
  drag draw dream dress drink drive drop dry earn eat edit educate embrace emerge employ enable
  encourage end enjoy ensure enter escape establish estimate evaluate examine exist expand expect
  experience explain explore express extend face fail fall fasten feed feel fetch fight fill find
  finish fit fix flee fling float flow fly fold follow forbid forecast forget forgive form freeze
  frighten gather generate get give glow go grab greet grind grip grow guarantee guess guide hang
  happen hate have head hear help hide highlight hire hit hold hop hope hug hunt hurry hurt
  identify ignore illustrate imagine implement imply import impress improve include increase
  indicate influence inform inspire install intend interpret introduce invent invest investigate
  invite involve join judge jump keep kick kill kiss kneel knit knock know label land last laugh
  lay lead lean leap learn leave lend let lie lift light like limit link list listen live load
  locate lock look lose love maintain make manage mark marry match matter mean measure meet melt
  mention mind miss mix move multiply name need negotiate note notice observe obtain occur offer
  open operate order organize outline overcome owe own paint park participate pass pause pay
  perform permit persuade pick place plan plant play please point pour practice praise pray predict
  prefer prepare present preserve press pretend prevent print proceed produce promise promote
  propose protect prove provide publish pull punch purchase push put question quit race rain
  raise reach read realize receive recognize recommend record recover reduce refer reflect refuse
  regret relate relax release rely remain remember remind remove repair repeat replace reply
  report represent request require research resolve respond rest restore result retire return
  reveal review revise rewrite ride ring rise risk roll rub ruin rule run rush save say scan
  schedule score scream search see seek seem select sell send separate serve set settle sew shake
  share shine shoot shop show shrink shut sigh sign sing sink sit skip sleep slide smell smile
  solve sort sound speak spell spend spin split spread stand start state stay steal step stick
  sting stop store strike strive study submit succeed suffer suggest summarize supply support
  suppose surprise survive suspect swear sweep swim swing take talk taste teach tear tell tend
  test thank think throw tie touch train transform translate travel treat trust try turn type
  understand undertake update upload urge use value verify view visit wait wake walk want warn
  wash watch water wave wear weave weep welcome win wind wish wonder work worry wrap write yell
  """.split()

_IRREGULAR_FORMS = """
  am is are was were been being has had does did done went gone made said saw seen took taken
  came knew known thought got gotten gave given found told became left felt brought began begun
  kept held wrote written stood heard meant met ran paid sat spoke spoken lay laid led grew grown
  lost fell fallen sent built understood drew drawn broke broken spent rose risen drove driven
  bought wore worn chose chosen sought threw thrown caught dealt won forgot forgotten slept sold
  taught fought flew flown hid hidden ate eaten drank drunk sang sung swam swum rode ridden shook
  shaken stole stolen woke woken froze frozen bit bitten blew blown hung dug fed fled bled bent
  bound ground wound shot shone slid spun stuck stung struck swore swept swung tore torn wept
  """.split()


@functools.lru_cache(maxsize=1)
def _verb_forms() -> frozenset[str]:
  forms = set(_IRREGULAR_FORMS)
  for base in _BASE_VERBS:
    forms.add(base)
    forms.update(_regular_inflections(base))
  return frozenset(forms)


def _regular_inflections(base: str) -> set[str]:
  vowels = "aeiou"
  if base.endswith("y") and len(base) > 1 and base[-2] not in vowels:
    third, past = base[:-1] + "ies", base[:-1] + "ied"
  elif base.endswith(("s", "sh", "ch", "x", "z", "o")):
    third, past = base + "es", base + "ed"
  else:
    third, past = base + "s", base + "ed"
  if base.endswith("e") and not base.endswith(("ee", "ye", "oe")):
    past, gerund = base + "d", base[:-1] + "ing"
  elif base.endswith("ie"):
    gerund = base[:-2] + "ying"
  else:
    gerund = base + "ing"
  forms = {third, past, gerund}
  # Consonant doubling for short closed syllables: stop -> stopped, stopping.
  if len(base) >= 3 and base[-1] not in vowels + "wxy" and base[-2] in vowels and base[-3] not in vowels:
    forms.update({base + base[-1] + "ed", base + base[-1] + "ing"})
  return forms


def is_verb(word: str) -> bool:
  """Whether `word` (any case) is a form of a verb in the lexicon (see the module docstring)."""
  return word.lower().replace("\u2019", "'") in _verb_forms()
