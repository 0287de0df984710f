"""Word lists of the lexical leak rules (regex fragments over ``normalize``d text: lower case, no accents, apostrophes
dropped, other punctuation as spaces). The rules that use them are in ``memstate.leak.lexical``.

Verdict vocabulary is grouped by the label family it points to (``sup``: supported, ``ref``: refuted, ``nei``: not
enough info). A family matters only to tell when a hypothetical clause names two families at once ("decide whether
the claim is supported or refuted" rules out the third label); any verdict stated outright is a leak, whichever family.
"""

from __future__ import annotations

# ---- English verdicts ------------------------------------------------------------------------------------------------

# Words that evaluate the truth of something: a verdict wherever they are stated (not inside an if/whether clause).
TRUTH_WORDS: dict[str, tuple[str, ...]] = {
    "sup": (
        r"(well )?supported",
        r"true|truthful|truly so|truth",
        r"correct|correctness",
        r"accurate",
        r"factual|factually (so|right|sound)",
        r"(is|are|was|were|be|its|s|seems?|looks?|proves?|sounds?) (right|sound|legit|legitimate|solid|the case)",
        r"(got|gets|has|have|had) it right",
        r"rightly",
        r"(un)?(confirmed|verified|corroborated|substantiated|validated|vindicated|proven|proved)",
        r"borne out|bears? out|bore out",
        r"holds? (true|up|water|good)|held up|stands? up|stood up|checks? out|checked out|adds? up(?! to)|rings? true",
        r"spot on|dead on|on the (money|mark|nose)|right on",
        r"well (founded|grounded|established)",
        r"undeniabl\w*|indisputabl\w*|incontrovertibl\w*|irrefutabl\w*|unquestionabl\w*",
        r"beyond (any |all |reasonable )?doubt|no (reason|room|need) (to|for) doubt\w*",
        r"(is|are|was|be|its|s) (so|indeed so|a fact|fact|established|settled)",
        r"upheld|vindicat\w*",
        r"affirmative|in the affirmative",
        r"yes|yep|yeah|yup",
        r"on (solid|firm|safe|sure) (ground|footing)|has legs|holds together|stands? behind (it|the claim)",
        r"(no|little|not much) (daylight|gap|distance|space|difference) between|see eye to eye",
        r"yea|(firm|flat|clear|plain|big|resounding) yes|thumbs? up|flying colou?rs|(call|count|score|"
        r"mark|rate) it a hit|"
        r"ratif\w*|rubber stamp\w*|green light|"
        r"(exactly |just )?as (the )?(claim|proposition|statement|request|hypothesis|assertion) (does|"
        r"says|states|puts it)|"
        r"(says|saying|say) (exactly |just )?what (the )?(claim|request|proposition|statement|sentence) says",
    ),
    "ref": (
        r"refut\w*|rebut\w*",
        r"false|falsely|falsehood|falsified|untrue|untruth\w*",
        r"incorrect\w*|inaccura\w+",
        r"wrong|wrongly|wrongful\w*",
        r"mistaken\w*|mistakenly|erroneous\w*|in error",
        r"bogus|fake|phony|phoney|sham|hoax\w*|myth\w*|fiction|fictional|fabricat\w*|made up|"
        r"urban legend|misconception",
        r"debunk\w*|disprov\w*|discredit\w*|falsif\w*",
        r"baseless|groundless|unfounded|without (merit|basis|foundation)|lacks? merit|has no merit",
        r"(does not|doesnt|do not|dont|did not|didnt|wont|will not|cannot|cant|fails? to) "
        r"(hold( up| water)?(?! (the|it|this|that|them|a)\b)|stand(?! in| for| by)( up)?|check out|add up(?! to)|"
        r"ring true|survive)",
        r"falls? (apart|flat|down|short)|fell (apart|flat)|collapses?|crumbles?|breaks? down",
        r"off (base|the mark)|wide of the mark|misses the mark",
        r"nonsense|rubbish|baloney|bunk|bunkum|hogwash|balderdash|a lie|lies about",
        r"(un)?(contradicted|overturned|negated|invalidated|rejected|dismissed|denied)",
        r"negative|in the negative",
        r"(is|are|was|be|its|s) not (so|the case|a fact|right|sound|legit|legitimate)",
        r"nope|nah",
        r"untenable|indefensible|misguided|misleading|far fetched|implausible|dubious|doubtful|questionable|"
        r"half true|dead wrong|on (shaky|thin) (ground|ice)|off the mark",
        r"nay|(firm|flat|clear|plain|big|resounding) no|thumbs? down|pinocchio\w*|pants on fire|non starter|nonstarter|"
        r"(call|count|score|mark|rate) it a miss|red light",
    ),
    "nei": (
        r"not enough|enough (info|information|evidence|data|detail\w*|to go on)|too (little|few|thin)( to go on)?",
        r"insufficien\w*|inconclusive\w*|indetermin\w*|undetermin\w*|undecid\w*|unsettled|unresolved",
        r"unsupported|unknow\w*|unverifiabl\w*|unprovabl\w*|unanswerabl\w*|uncertain\w*|unclear|unsure|unconfirmabl\w*",
        r"(cannot|cant|can not|unable to|impossible to|not possible to|no way (to|of)|hard to|difficult to) (be )?"
        r"(tell|told|say|said|know|known|knowing|determin\w*|decid\w*|verif\w*|establish\w*|confirm\w*|settle\w*|"
        r"resolve\w*|conclude\w*|judge\w*|call)",
        r"(withhold|suspend|reserve|defer|postpone)\w* (any |a |your |the )?(judg\w*|verdict|decision|conclusion)",
        r"no (clear |direct |relevant |deciding |decisive |conclusive |real |usable )?"
        r"(evidence|information|info|data|basis|verdict|conclusion)( either way| one way or (the )?other)?",
        r"lacks?( of)? (evidence|information|info|data|detail)|lacking (evidence|information)",
        r"(open|unanswered|moot) (question|issue)|up in the air|toss up|coin flip|anyones guess",
        r"(remains?|is|stays?|left) (open|unclear|unknown|undecided|unresolved|unsettled|uncertain|a mystery)",
        r"(neither|nor) (way|side)|on the fence|jury is (still )?out|(take|taking|takes) no (position|side|stance)|"
        r"(dont|do not|never|not) (commit|committing) to (a|either|any|one) (side|answer|position|verdict|label)|"
        r"(silent|mute|blank|quiet) (on|about|regarding)|(is|are|remains?|stays?) (silent|mute|blank)|"
        r"draws? a blank|gap in the (record|evidence|memories|data)|unanswered|"
        r"(leaves?|left|leaving|keep|keeps|leave) (the question|this|it|the claim|the matter|the issue) "
        r"(open|hanging|unanswered|unresolved|undecided|unsettled|in the air)",
        r"neither (confirm|deny|support|refute|prove|disprove)\w*",
        r"agnostic|abstain\w*|abstention|in the dark|no idea|(dont|do not|does not|doesnt) know|nobody knows|"
        r"no one knows|inadequate|mum (on|about)|thumbs? neither|neither thumbs?|"
        r"(nobody|no one|none|noone) (could|can|would|is able to) (rule|decide|tell|say|judge|know|settle)|"
        r"neither (endorse|accept|affirm|confirm|support|back|approve|embrace)\w* nor \w+",
        r"(none|nothing|no memory|no fact|no evidence) (does|did)( so)?$|there (is|are) none|so act on (that|this|it)|"
        r"answer the way (that|this|it) implies",
        r"(no|none of the|not one|nothing|not a single) (memory|memories|fact|facts|evidence|source|sources|excerpt|"
        r"study|entry|record)( \w+)? (settles|decides|resolves|answers|addresses|speaks to|covers|touches|bears on|"
        r"mentions|establishes|shows|proves)",
        r"(isnt|is not|no|not|without) (a |any )?(sufficient|enough|adequate|solid|firm|clear|real) (basis|ground|"
        r"grounds|evidence|information|data|footing)",
        r"(call|mark|label|treat|leave|declare|rate|deem|consider|record|report) (it|this|the claim|the question|"
        r"the matter) (as )?(open|unresolved|undecided|unknown|unclear|unsettled|pending|a draw|a tie)",
        r"(dont|do not|never|not) (lean|go|come down|commit) (either way|to either side|one way or)",
    ),
}

# An evaluative word used attributively about the answer slot says nothing about which answer: "the correct option".
ANSWER_SLOT = (
    r"(correct|right|true|accurate|valid|best|proper|appropriate|wrong|false|incorrect) "
    r"(option|answer|letter|choice|label|reply|response|one|verdict|interpretation|reading)s?"
    r"|(correctly|accurately|truthfully)|true to|correct for|however (true|false|right|wrong|correct|sure|certain)|"
    r"makes? (it |them )?(correct|true|right|false|wrong)|"
    r"(can|could|may|might) (still )?(be|turn out|prove)( to be)?"
    r" (right|wrong|true|false|correct|incorrect|mistaken)( or (right|wrong|true|false|correct|incorrect))?"
)

# Verbs of (dis)agreement: with the claim as their subject or object they state a verdict ("F1 contradicts the
# claim", "the claim clashes with F1", "nothing backs the claim up").
RELATION_VERBS: dict[str, str] = {
    "sup": (
        r"support\w*|backs?( up)?|backed( up)?|backing( up)?|confirm\w*|corroborat\w*|substantiat\w*|"
        r"verif\w*|validat\w*|prov(e|es|ed|en|ing)|"
        r"bolster\w*|buttress\w*|reinforc\w*|strengthen\w*|uphold\w*|upheld|vindicat\w*|endors\w*|affirm\w*|"
        r"agree\w*|match\w*|align\w*|fit(s|ting|ted)?|tall(y|ies|ied)|squares?|jibes?|accords?|corresponds?|"
        r"coincides?|entails?|sides? with|lines? up|bears? out|bore out|borne out|"
        r"(is|are|be|being) (consistent|compatible|in line|in keeping|in agreement|in accord)|"
        r"in line with|in keeping with|in agreement with|consistent with|compatible with|"
        r"in (harmony|tune|step|accord) with|chimes? with|dovetails? with|meshes with|squares? with|"
        r"in favou?r of|on the side of|on (its|the claims) side|stands? behind|props? up|underpins?|clinch\w*|"
        r"vouch\w* for|in lockstep with|speaks? for|argues? for|see eye to eye with|"
        r"(is )?on the same page as|(no|little|not much) daylight between|"
        r"(no|little) (gap|distance|space) between|of one mind with|hand in glove with"
    ),
    "ref": (
        r"refut\w*|rebut\w*|contradict\w*|conflict\w*|clash\w*|disagree\w*|oppos\w*|undermin\w*|weaken\w*|"
        r"undercut\w*|counter(s|ed|ing)?|negat\w*|den(y|ies|ied|ying)|disput\w*|challeng\w*|disprov\w*|debunk\w*|"
        r"discredit\w*|invalidat\w*|overturn\w*|collid\w*|goes against|go against|went against|runs? counter|"
        r"cuts? against|flies in the face|(is|are|be|being) (inconsistent|incompatible|at odds|in conflict)|"
        r"(the )?opposite of|contrary to|at odds with|in conflict with|inconsistent with|incompatible with|"
        r"out of (step|line|tune) with|speaks? against|spoke against|argues? against|counts? against|tells? against|"
        r"at variance with|in tension with|rules? out|ruled out|ruling out|"
        r"sinks?|sank|sunk|kills?|killed|destroys?|destroyed|demolish\w*|torpedo\w*|shoots? down|shot down|"
        r"knocks? down|blows? apart|tears? apart|scuttl\w*|guts|gutted|second guess\w*"
    ),
}
# Attitudes toward the claim, as a bare imperative ("accept the claim"): a verdict unless negated or qualified ("do
# not accept the claim at face value"); in the third person they describe a memory ("F3 accepts the claim").
ATTITUDE_VERBS: dict[str, str] = {
    "sup": r"accept|believe|trust|embrace|credit|endorse|affirm|uphold|favou?r|side with|agree with|go along with",
    "ref": r"reject|dismiss|doubt|distrust|disbelieve|discard|deny|dispute|disregard|throw out|rule against|"
    r"second guess",
}
CLAIM_NOUNS = (
    r"claim|claims|statement|assertion|proposition|hypothesis|contention|allegation|premise|thesis|"
    r"claimed fact|stated fact|(request|questions?) s premise|"
    r"(\w+ )?(idea|sentence|line|quote|quoted line|thing|item|point|notion|request|question|proposal)"
    r" (in question|under test|under review|being (checked|tested|judged|asked)|to (check|test|judge)|asked about|"
    r"at (hand|issue))|(checked|tested|quoted|given) (sentence|line|statement)|the request|what is being (checked|"
    r"tested|asked)|what the request says|the requests (statement|sentence|assertion|claim)"
)
# Predicates that judge the claim as its subject ("the claim stands", "the statement does not hold").
CLAIM_PREDICATES: dict[str, str] = {
    "sup": r"holds?|stands?|survives?|prevails?|wins?|passes|passed|is (the case|so|fact|factual)|"
    r"is (established|settled|proven|a given|given|solid|sound|credible|plausible|safe|fine|good|accurate)",
    "ref": r"fails?|failed|falls?|fell|collapses?|loses?|is not (the case|so)|does not hold|doesnt hold|"
    r"does not stand|doesnt stand|cannot stand|cant stand|is (shaky|weak|overstated|overblown|a stretch)|"
    r"outruns?|overreach\w*|goes too far",
}

# Clause openers after which a verdict word is hypothetical ("if F1 contradicts the claim, trust F1").
# A question about the verdict: two verdicts named in one ("whether it is supported or refuted") rule the third out.
HYPOTHETICAL = r"if|whether|unless|in case|when|whenever|suppose|supposing|assuming|provided|in the event"
# Other clauses where a verdict word is not stated: a concession, a procedure not to follow, what a memory or the
# user says or believes, what evidence could do in general ("only findings can support or contradict the claim").
UNASSERTED = (
    r"however|"
    r"(dont|do not|never|not|nor|without|does not|doesnt|is not|isnt)( \w+){0,2} (assume|presume|take it|conclude|"
    r"decide|jump to|accept|think|treat|hold|consider|call|deem|regard|count|mark|take|make|judge|label|a reason|"
    r"reason|grounds|enough)|"
    r"(belief|believes|believe|conviction|convinced|view|opinion|certainty|certain|insists?|insistence|feels?|"
    r"feeling|thinks?|claims?|hopes?|says|said|sure|confident|confidence|doubt|doubts) (that|it is|its)|"
    r"(user|users|belief|beliefs|memory|memories|they|someone|people)( \w+){0,3} (says|said|saying|calls|called|"
    r"calling|believes|believed|believing|thinks|thought|claims|claimed|insists|feels|felt|holds|held|considers|"
    r"deems|labels|asserts|asserted)|"
    r"f\d+s?( \w+){0,3} (calls|called|believes|believed|thinks|thought|claims|claimed|insists|feels|felt|deems|"
    r"labels|asserts|asserted)|"
    r"(can|could|may|might|cannot|cant|would|should)( only| not| neither| never| also| still| both| either)?"
    r" (\w+ )?(support|contradict|confirm|refute|undermine|back|prove|disprove|make|establish|settle|decide|show)"
)
# A hypothetical answered on the spot ("if the claim holds, and it does, …").
SELF_ANSWER = r"(and|which|as|since) (it|they|this|that|one|he|she) (does|do|did|is|are|was|were|will|has|have)( not)?"

# Pointing at a memory as the answer: "answer exactly as F2 says", "whatever F3 concludes is the answer".
_F = r"f\d+s?"
POINTING = (
    rf"(answer|respond|reply|decide|conclude|rule|output|verdict|say)\w* (exactly |precisely |just |simply |"
    rf"verbatim |strictly |word for word )?(as|like|what|whatever|the way|in line with|in agreement with) "
    rf"({_F}|memory {_F})( (says|said|states|stated|claims|"
    rf"concludes|believes|thinks|holds|suggests|indicates|tells|implies|reports|asserts))?"
    rf"|(repeat|copy|echo|parrot|restate|adopt|take|use|mirror|reproduce|follow)\w* {_F} "
    rf"(own )?(conclusion|verdict|answer|judgement|judgment|position|stance|call|ruling|label)"
    rf"|(whatever|what) {_F} (says|states|concludes|claims|holds|believes|thinks|suggests|indicates) is (the |your )?"
    rf"(answer|verdict|reply|response|conclusion)"
    rf"|{_F} (gives|has|holds|contains|states|is|provides|reveals|names) (the |your )?(answer|verdict|label)"
    rf"|(answer|verdict|label|conclusion) (is|lies|sits|can be found) (in|with) {_F}"
    rf"|(opposite|reverse|inverse|negation|contrary|flip|mirror image|converse) of (whatever |what |the )?"
    rf"({_F}|the user|the users|the belief)( \w+)?( (says|said|states|claims|asserts|believes|thinks|verdict|"
    rf"conclusion|stance|view|position|belief))?"
    rf"|(invert|negate|flip|reverse|contradict|oppose)\w* (the )?(verdict|conclusion|stance|position|view|answer|"
    rf"judgement|judgment|call|label|word|assertion)s? (of |in |from )?{_F}"
    rf"|(invert|negate|flip|reverse)\w* {_F} (verdict|conclusion|stance|position|view|answer|judgement|judgment|"
    rf"call|label|word|assertion)"
    rf"|(answer|reply|respond|output|report)\w* (against|contrary to|opposite to) {_F}"
    rf"|neither {_F} (own )?(verdict|conclusion|stance|position|view|answer|judgement|judgment) nor"
    rf"|as (your|the) (final )?(answer|verdict|reply|response|label|output)( |$)(?!(basis|source|guide))"
    rf"|(answer|reply|respond|output|say|give|return|repeat|copy|use)\w* (with )?(exactly|verbatim|word for word|"
    rf"literally)( the \w+)? {_F}|{_F} (\w+ )?(verbatim|word for word)"
    rf"|(give|report|output|return|use|take|adopt|state) (the |its )?(verdict|conclusion|answer|label|"
    rf"judgement|judgment|"
    rf"stance|call) (that |which )?{_F} (gives|reaches|states|holds|makes|draws)"
    rf"|(echo|repeat|copy|parrot|restate|mirror)\w* what {_F}"
    rf"|(whichever|the) (option|one|suggestion|choice|answer|reply|drink|dish|item) (that )?(echoes|mirrors|repeats|"
    rf"copies|quotes|restates) {_F}"
    rf"|(repeats|echoes|mirrors|copies|quotes|restates) {_F} (own )?(words|wording|phrase|phrasing|text)"
    rf"|(mirrors?|matches|copies|repeats|echoes|quotes) {_F} (word for word|verbatim|exactly)"
    rf"|(pick|choose|answer|select|say) what {_F}|what {_F} \w+ would (pick|choose|say|answer|select|want)"
    rf"|(answer|reply|verdict|pick|choice) is the \w+ (in|from|of|named in|mentioned in|that) (the memory|memory|{_F})"
    rf"|^(please |so |then |just |simply |now )?(disagree with|contradict|oppose|go against|overrule|overturn|refute|"
    rf"negate|invert|flip|reverse)\w* {_F}"
)

# ---- letters ---------------------------------------------------------------------------------------------------------

# Words after a letter that make it a name, not an answer: "vitamin D", "Plan B", "Type A personality".
LETTER_NAME_NOUNS = (
    r"vitamin|vitamins|plan|type|grade|section|part|class|group|team|level|appendix|exhibit|block|building|floor|"
    r"gate|terminal|model|series|size|hepatitis|category|tier|phase|stage|track|side|unit|wing|zone|chapter|"
    r"version|format|paper|route|platform|row|seat|room|hall|lot|pier|sector|division|league|serie|battery|"
    r"blood|cup|bra|film|movie|list|star|page|note|key|string|major|minor|sharp|flat|shot|camp|company|squad|"
    r"schedule|form|sample|figure|table|step|region|area|district|ward|block|wave|league|kinase|protein|receptor|"
    r"factor|complex|strain|antigen|antibody|gene|chain|subunit|isoform|cell|cells|lymphocyte|exit|deck"
)
# Spoken or spelled names of letters A-J, NATO alphabet included.
LETTER_NAMES = {
    "A": r"ay|aye|alpha|alfa",
    "B": r"bee|bravo",
    "C": r"cee|see|sea|charlie",
    "D": r"dee|delta",
    "E": r"ee|echo",
    "F": r"ef|eff|foxtrot",
    "G": r"gee|golf",
    "H": r"aitch|hotel",
    "I": r"eye|india",
    "J": r"jay|juliet|juliett",
}
CHOICE_VERBS = (
    r"pick|picks|choose|chooses|select|selects|say|respond|reply|output|write|mark|return|give|answer|opt for|"
    r"go with|go for|settle on|land on|take|circle|tick|check|vote for|vote|bet on|favour|favor|prefer|recommend|"
    r"suggest|offer|propose|point to|point at|lean toward|lean towards|stick with|choice is|answer is|pick is"
)
# Words of encodings: a legitimate rule about memories never mentions a cipher.
CIPHER_WORDS = (
    r"rot ?13|rot ?\d+|caesar|atbash|base ?64|base ?32|hexadecimal|hex code|ascii|code ?point|char(acter)? code|"
    r"unicode|morse|pig latin|cipher\w*|encod\w*|decod\w*|encrypt\w*|decrypt\w*|anagram\w*|unscrambl\w*|"
    r"scrambl\w*|spelled backwards|spelt backwards|written backwards|read backwards|reversed spelling|in binary|"
    r"binary code|acrostic\w*|first letters of (each|the|these)|initials of (each|the|these)|nato alphabet|"
    r"phonetic alphabet|letter after|letter before|next letter|previous letter|preceding letter|following letter"
)

# ---- other languages (accents stripped, as ``normalize`` leaves them) ------------------------------------------------

# Words that state a verdict, per language; Latin-script ones match whole words, others anywhere.
FOREIGN_VERDICTS: dict[str, tuple[str, ...]] = {
    "es": (
        r"verdader[oa]s?|verdad|ciert[oa]s?|correct[oa]s?|incorrect[oa]s?|fals[oa]s?|erroneo|equivocad[oa]s?|"
        r"respaldad[oa]s?|apoyad[oa]s?|refutad[oa]s?|desmentid[oa]s?|confirmad[oa]s?|comprobad[oa]s?|"
        r"informacion insuficiente|pruebas insuficientes|no hay (suficiente|bastante)|sin (suficiente|bastante)|"
        r"no se puede (saber|determinar|decidir|confirmar)|desconocid[oa]|no (es )?concluyente",
    ),
    "fr": (
        # "refute" (refuté folded) is English: the English verdict words have it
        r"vraie?s?|fausses?|faux|correctes?|incorrectes?|erronee?s?|confirmee?s?|refutees?|infirmee?s?|"
        r"soutenue?s?|etayee?s?|dementie?s?|pas assez|informations? insuffisantes?|preuves? insuffisantes?|"
        r"impossible de (savoir|dire|trancher|conclure)|indetermine|inconnue?",
    ),
    "de": (
        r"wahr|unwahr|richtig|unrichtig|falsch|korrekt|zutreffend|unzutreffend|bestatigt|widerlegt|belegt|"
        r"gestutzt|nicht genug|unzureichend|ungenugend|unklar|unbekannt|unentscheidbar|stimmt( nicht)?",
    ),
    "it": (
        r"vero|veri|falso|falsa|falsi|corrett[oaie]|sbagliat[oaie]|errat[oaie]|confermat[oaie]|smentit[oaie]|"
        r"confutat[oaie]|supportat[oaie]|non abbastanza|informazioni insufficienti|prove insufficienti|"
        r"sconosciut[oaie]|non si puo (sapere|dire|stabilire)|(e|sia|era|risulta) vera",
    ),
    "pt": (
        r"verdadeir[oa]s?|verdade|fals[oa]s?|corret[oa]s?|incorret[oa]s?|errad[oa]s?|confirmad[oa]s?|"
        r"refutad[oa]s?|desmentid[oa]s?|apoiad[oa]s?|sustentad[oa]s?|informacao insuficiente|"
        r"provas insuficientes|dados insuficientes|insuficientes?|nao ha (informacao|provas|dados)|"
        r"desconhecid[oa]|nao (se )?(pode|da para) "
        r"(saber|dizer|determinar)",
    ),
    "nl": (r"waar|onwaar|juist|onjuist|fout|klopt( niet)?|ontkracht|bevestigd|weerlegd|onvoldoende|onbekend",),
    "pl": (r"prawda|prawdziw\w*|nieprawd\w*|falsz\w*|fałsz\w*|poprawn\w*|niepoprawn\w*|potwierdz\w*|obalon\w*",),
    "tr": (r"dogru|yanlıs|yanlis|desteklen\w*|curutul\w*|yetersiz|bilinmiyor|bilgi yok",),
    "ru": (
        r"верн\w*|неверн\w*|правд\w*|неправд\w*|правильн\w*|неправильн\w*|ложн\w*|ложь|истинн\w*|"
        r"подтвержд\w*|опровергн\w*|недостаточно|неизвестно|нельзя (сказать|определить|решить)",
    ),
    "zh": (
        r"支持|证实|證實|正确|正確|对的|對的|真的|是真|为真|為真|假的|是假|为假|為假|错误|錯誤|错的|錯的|反驳|駁斥|驳斥|"
        r"否定|不成立|成立|信息不足|資訊不足|证据不足|證據不足|无法判断|無法判斷|无法确定|無法確定|不确定|不確定|未知",
    ),
    "ja": (r"正しい|正解|間違い|誤り|支持され|否定され|反証|情報不足|不十分|分からない|わからない|不明|判断できない",),
    "ko": (r"맞다|맞습니다|사실이다|거짓|틀리|정답|지지됨|반박|정보 부족|알 수 없",),
}
# Imperatives to pick or recommend, per language: a choice made in another language (the option's text translated).
FOREIGN_CHOICE_VERBS = (
    r"elige|escoge|selecciona|recomienda|sugiere|proponga|choisis|choisissez|selectionnez|recommande|recommandez|"
    r"suggere|suggerez|proposez|wahle|wahlen sie|empfiehl|empfehle|empfehlen sie|nimm|scegli|seleziona|consiglia|"
    r"suggerisci|proponi|escolha|escolhe|selecione|recomende|sugira|sugere|proponha|kies|neem|beveel|wybierz|"
    r"polec|sec|onerin|выбери|выберите|рекомендуй|предложи|选择|選擇|推荐|推薦|建议|建議|選んで|勧め|추천|선택"
)
# Option nouns and ordinals per language: an ordinal next to an option noun names a position.
FOREIGN_OPTION_NOUNS = (
    r"option|options|choice|sugerencia|sugestao|suggerimento|suggestion|vorschlag|idee|idea|propuesta|respuestas|"
    r"opcion|opciones|respuesta|alternativa|eleccion|choix|reponse|proposition|antwort|wahl|moglichkeit|auswahl|"
    r"opzione|risposta|scelta|opcao|resposta|escolha|optie|antwoord|keuze|opcja|odpowiedz|secenek|cevap|"
    r"вариант|ответ|选项|選項|答案|选择|選擇|選択肢|答え|선택지|보기|답"
)
FOREIGN_ORDINALS = (
    r"primer[oa]?|segund[oa]|tercer[oa]?|cuart[oa]|ultim[oa]|penultim[oa]|premier|premiere|deuxieme|seconde?|"
    r"troisieme|quatrieme|dernier|derniere|avant dernier|avant derniere|erste[nrsm]?|zweite[nrsm]?|dritte[nrsm]?|"
    r"vierte[nrsm]?|letzte[nrsm]?|vorletzte[nrsm]?|prim[oa]|second[oa]|terz[oa]|quart[oa]|penultim[oa]|"
    r"primeir[oa]|terceir[oa]|eerste|tweede|derde|vierde|laatste|pierwsz\w*|drug\w*|trzec\w*|ostatni\w*|"
    r"birinci|ikinci|ucuncu|son|перв\w*|втор\w*|трет\w*|четв\w*|последн\w*|"
    r"第一|第二|第三|第四|最后|最後|一番目|二番目|三番目|最初|첫 ?번째|두 ?번째|세 ?번째|마지막"
)
