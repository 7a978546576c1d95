package api

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
)

func randomStreamID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func decodeExit(p []byte, v any) error { return json.Unmarshal(p, v) }
