package cloudinit

import (
	"strings"
	"testing"
)

func TestPlaceholdersInTheSeed(t *testing.T) {
	c := testConfig(t)
	ph := "abox-ph-00112233445566778899aabbccddeeff"
	c.Placeholders = [][2]string{{"OPENAI_API_KEY", ph}, {"GH_TOKEN", "abox-ph-ffeeddccbbaa99887766554433221100"}}
	s, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	ud := string(s.UserData)
	for _, want := range []string{
		profileSecretsFile, systemdSecretsFile, userdSecretsFile,
		"export OPENAI_API_KEY=" + ph,
		"OPENAI_API_KEY=" + ph + "\n",
		`DefaultEnvironment="OPENAI_API_KEY=` + ph + `" "GH_TOKEN=`,
	} {
		if !strings.Contains(ud, want) {
			t.Errorf("user-data lacks %q", want)
		}
	}
	// Without placeholders the seed is as before (the golden file).
	c.Placeholders = nil
	s, err = Render(c)
	if err != nil || strings.Contains(string(s.UserData), "abox-secrets") {
		t.Fatalf("a seed without placeholders has their files (%v)", err)
	}
}

func TestPlaceholdersRefuseValues(t *testing.T) {
	const value = "sk-live-abcdef0123456789"
	for _, c := range []struct {
		name string
		env  [][2]string
		want string
	}{
		{"a value", [][2]string{{"TOK", value}}, "never a secret's value"},
		{"upper hex", [][2]string{{"TOK", "abox-ph-00112233445566778899AABBCCDDEEFF"}}, "32 hex"},
		{"bad name", [][2]string{{"A B", "abox-ph-00112233445566778899aabbccddeeff"}}, "environment variable name"},
		{"twice", [][2]string{{"T", "abox-ph-00112233445566778899aabbccddeeff"}, {"T", "abox-ph-00112233445566778899aabbccddeeff"}}, "twice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Placeholders = c.env
			_, err := Render(cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Render = %v; want an error with %q", err, c.want)
			}
			if strings.Contains(err.Error(), value) {
				t.Errorf("the error quotes the value: %v", err)
			}
		})
	}
}
