package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// Sign is a delivery's X-Sbx-Signature: "sha256=" and the hex
// HMAC-SHA256, under the webhook's secret, of the timestamp (unix
// seconds, as X-Sbx-Timestamp says it), ".", and the body. The timestamp
// is signed so that a captured delivery cannot be sent again later
// (receivers refuse old timestamps); client.VerifyWebhook checks it.
func Sign(secret string, timestamp int64, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(strconv.FormatInt(timestamp, 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}
