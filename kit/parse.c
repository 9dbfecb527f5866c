/* Strict number parsing (see parse.h). Integers are accumulated by hand over a span, so a
 * list item needs no copy and overflow is exact; doubles are checked against a decimal
 * grammar first and only then converted by strtod (which alone would take " 1", "0x1p3",
 * "nan" and "1abc"). */
#include "parse.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* gcc: the build turns -Wformat-truncation off for every file (message buffers elsewhere
 * trip it); in this file every path, name and value copy is length-checked, so a copy that
 * could be cut is an error here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic error "-Wformat-truncation"
#endif

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* s[0 .. n) as a decimal integer in [lo, hi]. */
static vl_parse_status parse_i64_span(const char *s, size_t n, int64_t lo, int64_t hi, int64_t *out) {
  if (n == 0) return VL_PARSE_EMPTY;
  size_t i = 0;
  bool neg = false;
  if (s[0] == '+' || s[0] == '-') { neg = s[0] == '-'; i = 1; }
  if (i == n) return VL_PARSE_SYNTAX; /* a sign alone */
  /* magnitude limit: 2^63 for a negative number, 2^63 - 1 for a positive one */
  const uint64_t limit = neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
  uint64_t mag = 0;
  bool overflow = false;
  for (; i < n; i++) {
    if (!is_digit(s[i])) return VL_PARSE_SYNTAX;
    unsigned d = (unsigned)(s[i] - '0');
    /* keep scanning after an overflow: "99999999999999999999x" is junk, not a range error */
    if (!overflow && (mag > (limit - d) / 10)) overflow = true;
    if (!overflow) mag = mag * 10 + d;
  }
  if (overflow) return VL_PARSE_RANGE;
  int64_t v = neg ? (mag == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
  if (v < lo || v > hi) return VL_PARSE_RANGE;
  *out = v;
  return VL_PARSE_OK;
}

vl_parse_status vl_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  if (!s) return VL_PARSE_EMPTY;
  return parse_i64_span(s, strlen(s), lo, hi, out);
}

static bool ieq(const char *a, const char *b) { /* ASCII case-insensitive, no locale */
  for (; *a && *b; a++, b++) {
    char x = *a >= 'A' && *a <= 'Z' ? (char)(*a + 32) : *a;
    if (x != *b) return false;
  }
  return !*a && !*b;
}

/* [+-]? (digits [. digits*]? | . digits) ([eE] [+-]? digits)?, or [+-]? inf|infinity|nan */
static bool decimal_grammar(const char *s, bool *special) {
  const char *p = s;
  if (*p == '+' || *p == '-') p++;
  *special = ieq(p, "inf") || ieq(p, "infinity") || ieq(p, "nan");
  if (*special) return true;
  size_t int_digits = 0, frac_digits = 0;
  while (is_digit(*p)) { p++; int_digits++; }
  if (*p == '.') {
    p++;
    while (is_digit(*p)) { p++; frac_digits++; }
  }
  if (int_digits + frac_digits == 0) return false;
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-') p++;
    if (!is_digit(*p)) return false;
    while (is_digit(*p)) p++;
  }
  return *p == 0;
}

vl_parse_status vl_parse_f64(const char *s, double lo, double hi, double *out) {
  if (!s || !*s) return VL_PARSE_EMPTY;
  bool special;
  if (!decimal_grammar(s, &special)) return VL_PARSE_SYNTAX;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (*end) return VL_PARSE_SYNTAX; /* cannot happen after the grammar; kept as a guard */
  /* ERANGE: overflow to HUGE_VAL, or underflow to a subnormal or zero */
  if (errno == ERANGE && !special) return VL_PARSE_RANGE;
  if (!(v >= lo && v <= hi)) return VL_PARSE_RANGE; /* NaN fails both comparisons */
  *out = v;
  return VL_PARSE_OK;
}

vl_parse_status vl_parse_i64_list(const char *s, int64_t lo, int64_t hi, int64_t *out, int max,
                                  int *n) {
  if (!s || !*s) return VL_PARSE_EMPTY;
  int k = 0;
  for (const char *p = s;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (k >= max) return VL_PARSE_TOO_MANY;
    int64_t v;
    vl_parse_status st = parse_i64_span(p, len, lo, hi, &v);
    if (st != VL_PARSE_OK) return st;
    out[k++] = v;
    if (!comma) break;
    p = comma + 1;
  }
  *n = k;
  return VL_PARSE_OK;
}

const char *vl_parse_why(vl_parse_status st) {
  switch (st) {
    case VL_PARSE_OK: return "is fine";
    case VL_PARSE_EMPTY: return "is empty";
    case VL_PARSE_SYNTAX: return "is not a number";
    case VL_PARSE_RANGE: return "is out of range";
    case VL_PARSE_TOO_MANY: return "has too many items";
  }
  return "is invalid";
}
