package strictjson_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/strictjson"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in      string
		msg     string // "": valid
		pointer string
		field   string
	}{
		{in: `{"entity":"a","payload":{"x":[1,"\ud83d\ude00"]}}`},
		{in: " \t\n[1, 2]\n"},
		{in: `"a\u0000b"`},
		{in: `{"entity":"a\ud800","x":1}`, msg: "holds a lone UTF-16 surrogate escape", pointer: "/entity", field: "entity"},
		{in: `{"entity":"\udc00"}`, msg: "holds a lone UTF-16 surrogate escape", pointer: "/entity", field: "entity"},
		{in: `{"p":{"q":"\ud83d x"}}`, msg: "holds a lone UTF-16 surrogate escape", pointer: "/p/q", field: "p"},
		{in: "{\"entity\":\"a\xff\"}", msg: "holds invalid UTF-8", pointer: "/entity", field: "entity"},
		{in: "{\"a\xc3\":1}", msg: "holds invalid UTF-8"},
		{in: `{"entity":"a","entity":"b"}`, msg: "is given twice", pointer: "/entity", field: "entity"},
		{in: `{"entity":"a","\u0065ntity":"b"}`, msg: "is given twice", field: "entity"},
		{in: `{"payload":{"a":1,"a":2}}`, msg: "is given twice", pointer: "/payload/a", field: "payload"},
		{in: `[{"a":1},{"b":1,"b":1}]`, msg: "is given twice", pointer: "/1/b", field: "1"},
		{in: `{"a/b":1,"a/b":2}`, msg: "is given twice", pointer: "/a~1b", field: "a/b"},
		{in: `{"a":1} {"b":2}`, msg: "holds more than one JSON value"},
		{in: `{"a":1`, msg: "ends before its JSON value does"},
		{in: ``, msg: "ends before its JSON value does"},
		{in: `{"a":01}`, msg: "is not valid JSON"},
	} {
		err := strictjson.Check([]byte(tt.in))
		if tt.msg == "" {
			require.NoError(t, err, "%q", tt.in)
			continue
		}
		require.Error(t, err, "%q", tt.in)
		var se *strictjson.Error
		require.ErrorAs(t, err, &se, "%q", tt.in)
		require.Contains(t, se.Msg, tt.msg, "%q", tt.in)
		if tt.pointer != "" {
			require.Equal(t, tt.pointer, se.Pointer, "%q", tt.in)
		}
		if tt.field != "" {
			require.Equal(t, tt.field, se.Field(), "%q", tt.in)
		}
		require.Contains(t, err.Error(), tt.msg)
	}
}

func TestUnmarshal(t *testing.T) {
	t.Parallel()
	type answer struct {
		Results []struct {
			OK bool `json:"ok"`
		} `json:"results"`
	}
	var a answer
	require.NoError(t, strictjson.Unmarshal([]byte(`{"results":[{"ok":true}],"extra":1}`), &a, false))
	require.True(t, a.Results[0].OK)
	require.ErrorContains(t, strictjson.Unmarshal([]byte(`{"results":[],"results":[{"ok":true}]}`), &a, false), `/results is given twice`)
	a = answer{}
	require.NoError(t, strictjson.Unmarshal([]byte(`{"Results":[{"ok":true}]}`), &a, false))
	require.Nil(t, a.Results, "names match exactly: Results is not results")
	require.Error(t, strictjson.Unmarshal([]byte(`{"results":[],"extra":1}`), &a, true), "unknown member refused")
	require.Error(t, strictjson.Unmarshal([]byte(`{"results":"x"}`), &a, false), "wrong type")
}

func TestErrorBelow(t *testing.T) {
	t.Parallel()
	err := strictjson.Check([]byte(`{"payload":{"x":{"a":1,"a":2}}}`))
	var se *strictjson.Error
	require.ErrorAs(t, err, &se)
	require.Equal(t, strictjson.Duplicate, se.Kind)
	require.Equal(t, "payload", se.Field())
	require.Equal(t, "/x/a", se.Below())
	require.Equal(t, "/payload/x/a is given twice (byte 23)", err.Error())
}
