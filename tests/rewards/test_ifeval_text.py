"""recipe_jax.rewards.ifeval text units: sentence, word and paragraph splitting, syllables, emoji, language."""

import pytest

from recipe_jax.rewards.ifeval import SUPPORTED_LANGUAGES, detect_language
from recipe_jax.rewards.ifeval import text

SENTENCE_CASES = [
  ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
  ("Dr. Smith arrived at 3.30 p.m. today. He left.", ["Dr. Smith arrived at 3.30 p.m. today.", "He left."]),
  ("Fruit, e.g. Apples, and i.e. Pears. Next.", ["Fruit, e.g. Apples, and i.e. Pears.", "Next."]),
  ("Mr. and Mrs. Brown met Prof. Lee vs. Dr. Kay.", ["Mr. and Mrs. Brown met Prof. Lee vs. Dr. Kay."]),
  ("Apples, pears, etc. The end.", ["Apples, pears, etc.", "The end."]),
  ("J. K. Rowling wrote it. It sold.", ["J. K. Rowling wrote it.", "It sold."]),
  ("Item No. 5 is here. I said no. Then left.", ["Item No. 5 is here.", "I said no.", "Then left."]),
  ("Pi is 3.14159 roughly. Visit example.com now.", ["Pi is 3.14159 roughly.", "Visit example.com now."]),
  ("Wait... and then? It ended... Then silence.", ["Wait... and then?", "It ended...", "Then silence."]),
  ('He said "Go home." She did.', ['He said "Go home."', "She did."]),
  ("Really?! Yes.", ["Really?!", "Yes."]),
  ("(It rained.) We stayed.", ["(It rained.)", "We stayed."]),
  ("# Title\nFirst line\n\n1. Item one\n2. Item two", ["# Title", "First line", "1. Item one", "2. Item two"]),
  ("1.\nFirst item.", ["1. First item."]),
  ("Great news!\n!!!\nMore.", ["Great news! !!!", "More."]),
  ("", []),
  ("  \n \n", []),
]


@pytest.mark.parametrize("raw, expected", SENTENCE_CASES)
def test_split_sentences(raw, expected):
  assert text.split_sentences(raw) == expected


def test_word_units():
  assert text.word_tokens("Don't stop: 3.5 well-known") == ["Don", "t", "stop", "3", "5", "well", "known"]
  assert text.count_words("Don't stop") == 3
  assert text.words("Don't stop: 3.5 well-known, ok—fine") == ["Don't", "stop", "3", "5", "well-known", "ok", "fine"]
  assert text.words("हिंदी भाषा") == ["हिंदी", "भाषा"]
  assert text.words("*** ... !!!") == []


def test_split_paragraphs_and_lines():
  assert text.split_paragraphs("A\nB\n\nC\n \n\n\nD\n") == ["A\nB", "C", "D"]
  assert text.split_paragraphs("\n\n") == []
  assert text.split_lines(" a \n\n b\n") == ["a", "b"]


@pytest.mark.parametrize(
  "word, syllables",
  [("cat", 1), ("the", 1), ("make", 1), ("makes", 1), ("jumped", 1), ("wanted", 2), ("table", 2), ("little", 2),
   ("people", 2), ("water", 2), ("hello", 2), ("create", 2), ("lion", 2), ("being", 2), ("going", 2), ("nation", 2),
   ("piano", 3), ("video", 3), ("beautiful", 3), ("syllable", 3), ("quality", 3), ("education", 4), ("a", 1),
   ("Rhythm", 1), ("42", 0)],
)
def test_count_syllables(word, syllables):
  assert text.count_syllables(word) == syllables


def test_is_emoji():
  assert all(text.is_emoji(ch) for ch in "🙂🚀🎉👍❤✅⭐🇫🤖🫠")
  assert not any(text.is_emoji(ch) for ch in "a.!?1é中\u200d\ufe0f")
  assert not text.is_emoji("🙂🙂")


LANGUAGE_SAMPLES = {
  "en": "The weather is nice today and we are going to the park with our friends.",
  "es": "El tiempo está muy bien hoy y vamos al parque con nuestros amigos.",
  "pt": "O tempo está muito bom hoje e nós vamos ao parque com os nossos amigos.",
  "fr": "Il fait beau aujourd'hui et nous allons au parc avec nos amis.",
  "de": "Das Wetter ist heute schön und wir gehen mit unseren Freunden in den Park.",
  "it": "Il tempo è bello oggi e andiamo al parco con i nostri amici.",
  "nl": "Het weer is vandaag mooi en we gaan met onze vrienden naar het park.",
  "sv": "Vädret är fint i dag och vi går till parken med våra vänner.",
  "fi": "Sää on tänään kaunis ja me menemme puistoon ystävien kanssa.",
  "pl": "Pogoda jest dziś ładna i idziemy do parku z naszymi przyjaciółmi.",
  "tr": "Bugün hava çok güzel ve arkadaşlarımızla parka gidiyoruz.",
  "id": "Cuaca hari ini bagus dan kami akan pergi ke taman dengan teman.",
  "vi": "Hôm nay thời tiết đẹp và chúng tôi đi công viên với những người bạn.",
  "sw": "Hali ya hewa ni nzuri leo na tunaenda kwenye bustani na marafiki wetu.",
  "ru": "Сегодня хорошая погода, и мы идём в парк с нашими друзьями.",
  "uk": "Сьогодні гарна погода, і ми йдемо до парку з нашими друзями.",
  "bg": "Времето днес е хубаво и ние отиваме в парка с нашите приятели.",
  "ar": "الطقس جميل اليوم ونحن ذاهبون إلى الحديقة مع أصدقائنا.",
  "fa": "هوا امروز خوب است و ما با دوستان به پارک می رویم.",
  "ur": "آج موسم اچھا ہے اور ہم اپنے دوستوں کے ساتھ پارک جا رہے ہیں۔",
  "hi": "आज मौसम अच्छा है और हम अपने दोस्तों के साथ पार्क जा रहे हैं।",
  "mr": "आज हवामान छान आहे आणि आम्ही मित्रांसोबत उद्यानात जात आहोत.",
  "ne": "आज मौसम राम्रो छ र हामी साथीहरूसँग पार्कमा जाँदैछौं।",
  "ja": "今日は天気が良いので、友達と公園に行きます。",
  "zh": "今天天气很好，我们和朋友一起去公园。",
  "ko": "오늘은 날씨가 좋아서 친구들과 공원에 갑니다.",
  "th": "วันนี้อากาศดีและเราจะไปสวนสาธารณะกับเพื่อน",
  "he": "מזג האוויר היום יפה ואנחנו הולכים לפארק עם חברים.",
  "el": "Ο καιρός είναι ωραίος σήμερα και πηγαίνουμε στο πάρκο με φίλους.",
  "bn": "আজ আবহাওয়া ভালো এবং আমরা বন্ধুদের সাথে পার্কে যাচ্ছি।",
  "ta": "இன்று வானிலை நன்றாக உள்ளது, நாங்கள் நண்பர்களுடன் பூங்காவிற்கு செல்கிறோம்.",
  "te": "ఈ రోజు వాతావరణం బాగుంది మరియు మేము స్నేహితులతో పార్కుకు వెళ్తున్నాము.",
  "kn": "ಇಂದು ಹವಾಮಾನ ಚೆನ್ನಾಗಿದೆ ಮತ್ತು ನಾವು ಸ್ನೇಹಿತರೊಂದಿಗೆ ಉದ್ಯಾನಕ್ಕೆ ಹೋಗುತ್ತಿದ್ದೇವೆ.",
  "ml": "ഇന്ന് കാലാവസ്ഥ നല്ലതാണ്, ഞങ്ങൾ സുഹൃത്തുക്കളോടൊപ്പം പാർക്കിലേക്ക് പോകുന്നു.",
  "gu": "આજે હવામાન સારું છે અને અમે મિત્રો સાથે બગીચામાં જઈએ છીએ.",
  "cs": "Dnes je hezké počasí a my jdeme do parku s našimi přáteli, když je to možné.",
  "ro": "Vremea este frumoasă astăzi și mergem în parc cu prietenii noștri.",
  "pa": "ਅੱਜ ਮੌਸਮ ਵਧੀਆ ਹੈ ਅਤੇ ਅਸੀਂ ਦੋਸਤਾਂ ਨਾਲ ਪਾਰਕ ਜਾ ਰਹੇ ਹਾਂ।",
}


@pytest.mark.parametrize("language", sorted(LANGUAGE_SAMPLES))
def test_detect_language(language):
  assert detect_language(LANGUAGE_SAMPLES[language]) == language


def test_language_samples_cover_the_ifeval_languages():
  ifeval_languages = {"en", "es", "pt", "ar", "hi", "fr", "ru", "de", "ja", "it", "bn", "uk", "th", "ur", "ta", "te",
                      "bg", "ko", "pl", "he", "fa", "vi", "ne", "sw", "kn", "mr", "gu", "pa", "ml", "fi"}
  assert ifeval_languages <= SUPPORTED_LANGUAGES == set(LANGUAGE_SAMPLES)


def test_detect_language_without_evidence():
  assert detect_language("") == "und"
  assert detect_language("123 456 !!! 🙂") == "und"
  assert detect_language("Xyzzy plugh") == "und"
